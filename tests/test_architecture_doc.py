"""docs/architecture.md stays true: it names every module, every path it names exists, and it
lists every import contract that the lint env enforces."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "devicehost"
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`((?:[a-z_]+/)*[a-z_]+(?:\.py|/))`")


def _named_paths() -> set[str]:
    return set(PATH.findall(DOC.read_text()))


def _modules() -> list[str]:
    return sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "proto" not in p.relative_to(PACKAGE).parts
    )


def test_every_module_is_on_the_page() -> None:
    named = _named_paths()
    missing = [
        module
        for module in _modules()
        if module not in named
        and not (module.endswith("__init__.py") and module[: -len("__init__.py")] in named)
    ]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_path_on_the_page_exists() -> None:
    named = {p for p in _named_paths() if "/" in p or p.endswith(".py")}
    assert {"host/app.py", "host/serving/"} <= named
    gone = sorted(p for p in named if not (PACKAGE / p).exists() and not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names paths that do not exist: {gone}"


def test_every_import_contract_is_listed() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    contracts = [config[s]["name"] for s in config.sections() if s.startswith("importlinter:contract:")]
    assert len(contracts) >= 7
    text = DOC.read_text()
    unlisted = [name for name in contracts if f"**{name}" not in text]
    assert not unlisted, f"docs/architecture.md does not list the contracts: {unlisted}"
