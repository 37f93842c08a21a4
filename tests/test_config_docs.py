"""The docs say what the command line and the config model do: the README's configuration table
is the one tools/config_table.py generates from the model, and every ``devicehost ...`` command
line in README.md, docs/ and deploy/ parses with the real parser."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from devicehost.host.cli import parse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import config_table  # noqa: E402

pytestmark = pytest.mark.usefixtures("logging_untouched")

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`((?:python -m )?devicehost [^`]*)`")
CODE_LINE = re.compile(r"^\s*(?:\$ )?(?:\S*/)?(devicehost .*)$")
PLACEHOLDERS = {"FILE": "config.yaml", "[--address": "--address", "HOST:PORT]": "127.0.0.1:9464"}


def documented_commands() -> list[tuple[str, str]]:
    """``(where, command line)`` for every devicehost command the docs show, in code."""
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.findall(text):
            for line in block.splitlines():
                match = CODE_LINE.match(line.split("  #")[0].rstrip())
                if match:
                    found.append((doc.name, match.group(1)))
        found += [(doc.name, command) for command in INLINE.findall(FENCE.sub("", text))]
    return found


def deployed_commands() -> list[tuple[str, str]]:
    """The Dockerfile's entrypoint with its CMD, and with each DaemonSet container's ``args``."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.MULTILINE)[1])  # type: ignore[index]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)[1])  # type: ignore[index]
    found = [("Dockerfile", shlex.join([*entrypoint, *cmd]))]
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            for container in _containers(document):
                if "args" in container or "command" in container:
                    argv = [*container.get("command", entrypoint), *container.get("args", [])]
                    found.append((str(path.relative_to(ROOT)), shlex.join(argv)))
    return found


def _containers(document: object) -> list[dict[str, object]]:
    spec = document.get("spec", {}) if isinstance(document, dict) else {}
    pod = spec.get("template", {}).get("spec", {}) if isinstance(spec, dict) else {}
    return [c for c in pod.get("containers", []) if isinstance(c, dict)] if isinstance(pod, dict) else []


def parses(command: str) -> str | None:
    """None when the real parser takes ``command``; else what it printed."""
    argv = [PLACEHOLDERS.get(word, word) for word in shlex.split(command)]
    argv = argv[argv.index("devicehost") + 1 :]
    try:
        parse(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else f"exit {exc.code}"
    return None


def test_the_readme_configuration_table_is_the_models() -> None:
    readme = config_table.README.read_text()
    assert config_table.replaced(readme) == readme, "run: python tools/config_table.py"


def test_the_table_names_every_setting_once() -> None:
    from devicehost.host.config import settings

    table = config_table.table()
    for setting in settings():
        assert table.count(f"| `{setting.key}` |") == 1
        assert f"`{setting.env}`" in table


def test_the_docs_show_commands() -> None:
    commands = [c for _, c in documented_commands()]
    assert "devicehost config check FILE" in commands
    assert any(c.startswith("devicehost run --simulate-kubelet") for c in commands)
    assert any("--config" in c for _, c in deployed_commands())


@pytest.mark.parametrize(("where", "command"), [*documented_commands(), *deployed_commands()])
def test_every_documented_command_parses(
    where: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if command.endswith("..."):
        pytest.skip("a pattern, not a command")
    problem = parses(command)
    assert problem is None, f"{where}: {command!r} does not parse: {capsys.readouterr().err}"


@pytest.mark.parametrize(
    "command",
    [
        "devicehost run --metrics-addres 127.0.0.1:1",
        "devicehost config check",
        "devicehost status --backend x",
    ],
)
def test_the_check_fails_a_command_that_does_not_parse(command: str) -> None:
    assert parses(command) is not None


def documented_configs() -> list[tuple[str, str]]:
    """The YAML config files the docs show (a ```yaml block of host config keys) and deploy/ ships."""
    from devicehost.host.config import HostConfig

    found = []
    for doc in DOCS:
        for block in re.findall(r"^```yaml\n(.*?)^```$", doc.read_text(), re.MULTILINE | re.DOTALL):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and set(data) & set(HostConfig.model_fields):
                found.append((doc.name, block))
    configs = [
        ROOT / "deploy" / "base" / "config.yaml",
        *sorted((ROOT / "deploy").glob("overlays/*/config.yaml")),
    ]
    return found + [(str(path.relative_to(ROOT)), path.read_text()) for path in configs]


@pytest.mark.parametrize(("where", "text"), documented_configs())
def test_every_documented_config_passes_config_check(
    where: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devicehost.host.cli import main

    config_file = tmp_path / "config.yaml"
    data = yaml.safe_load(text)
    if not data.get("enabled_backends"):  # every installed one: as in an image, without the
        # suite's own broken-on-purpose backends, which `config check` rightly refuses
        data["disabled_backends"] = [*data.get("disabled_backends", []), *TEST_ONLY_BACKENDS]
        text = yaml.safe_dump(data)
    config_file.write_text(text)
    assert main(["config", "check", str(config_file)]) == 0, f"{where}: {capsys.readouterr().err}"


TEST_ONLY_BACKENDS = ("broken-conformance", "unresolvable-cdi", "failing-start")
"""Backends of tests/backends/: installed in the suite's venv, in no image."""
