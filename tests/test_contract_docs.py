"""Meta-tests: every hook spec documented with its exact signature and exercised by a test; the
backend walk-through in docs/writing-a-backend.md installs and passes conformance as written."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from projects import run_testenv, tox_commands

from devicehost.hookspecs import spec

ROOT = Path(__file__).resolve().parent.parent
HOOKS_DOC = ROOT / "docs" / "hooks.md"
HOOKS = sorted(name for name in vars(spec) if name.startswith("devicehost_"))


def signature_text(name: str) -> str:
    """``def name(arg: type, ...) -> type`` as written in the spec."""
    function: Callable[..., Any] = getattr(spec, name)
    signature = inspect.signature(function)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


def doc_section(name: str) -> str:
    """The text of ``## name`` in docs/hooks.md, up to the next heading."""
    match = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", HOOKS_DOC.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"docs/hooks.md has no '## {name}' section"
    return match.group(1)


def test_the_spec_module_has_hooks() -> None:
    assert "devicehost_allocate" in HOOKS
    assert len(HOOKS) == 15  # fourteen the host calls, one test seam (devicehost_conformance_set_health)


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_documented_with_its_exact_signature(name: str) -> None:
    section = doc_section(name)
    assert f"```python\n{signature_text(name)}\n```" in section
    firstresult = getattr(spec, name).devicehost_spec["firstresult"]
    assert f"**firstresult**: {'yes' if firstresult else 'no'}" in section
    assert "**Called**" in section
    assert "**Raises**" in section


def test_docs_document_no_hook_that_does_not_exist() -> None:
    documented = re.findall(r"^## (devicehost_\w+)$", HOOKS_DOC.read_text(), re.MULTILINE)
    assert sorted(documented) == HOOKS


def _test_sources() -> dict[Path, str]:
    """Every Python file of the test suites (fakes included), except this one."""
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "plugins").glob("*/tests/**/*.py")]
    return {path: path.read_text() for path in files if path.resolve() != Path(__file__).resolve()}


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_exercised_by_a_test(name: str) -> None:
    users = [path for path, text in _test_sources().items() if re.search(rf"\b{name}\b", text)]
    assert users, f"no test calls or implements {name}"


WALKTHROUGH = ROOT / "docs" / "writing-a-backend.md"
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def doc_files() -> dict[str, str]:
    """The files the walk-through writes, by path."""
    return dict(FILE_BLOCK.findall(WALKTHROUGH.read_text()))


def test_the_doc_writes_a_whole_backend() -> None:
    assert set(doc_files()) == {
        "pyproject.toml",
        "setup.cfg",
        "src/devicehost_acme/__init__.py",
        "conformance.yaml",
        "tests/test_acme.py",
        "tox.ini",
    }


def get_devicehost() -> list[str]:
    """The commands of the walk-through's "Get devicehost" block after its ``git clone``."""
    section = WALKTHROUGH.read_text().split("\n## Get devicehost\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block is not None
    lines = [line.split("  #")[0].strip() for line in block[1].splitlines() if line.strip()]
    assert lines[0] == "git clone <devicehost repository> devicehost"
    return lines[1:]


def _fresh_clone(to: Path) -> Path:
    """The files a fresh clone of this checkout has (tracked, and new ones git does not ignore)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def test_getting_devicehost_builds_its_wheel_from_a_path_into_the_backend_directory() -> None:
    """A bare name is a package name to pip: the wheel is built from the clone's path, into the
    backend's own wheels/ (where tox.ini's PIP_FIND_LINKS and the install line look)."""
    wheel, cd, install = get_devicehost()
    assert wheel == "python -m pip wheel --no-deps -w devicehost-acme/wheels ./devicehost"
    assert cd == "cd devicehost-acme"
    assert install == "pip install --find-links wheels -e '.[testing]'"
    assert "{tox_root}{/}wheels" in doc_files()["tox.ini"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_documented_backend_installs_and_passes_conformance(short_tmp: Path) -> None:
    project = short_tmp / "devicehost-acme"
    for path, text in doc_files().items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    venv = short_tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    clone = _fresh_clone(short_tmp / "devicehost")
    # "Get devicehost", as written, after the clone: the wheel, then the backend installed with it
    commands = [". venv/bin/activate", *get_devicehost()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEVICEHOST_", "VIRTUAL_ENV"))}
    installed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", " && ".join(commands)],
        cwd=short_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert list((project / "wheels").glob("devicehost-*.whl")), "the wheel is not where pip looks"
    assert clone.is_dir()
    backends = subprocess.run(
        [str(venv / "bin" / "devicehost"), "backends"], capture_output=True, text=True, timeout=30
    )
    assert "acme  (devicehost-acme 0.1.0, devicehost_acme:AcmeBackend)  loaded" in backends.stdout, (
        backends.stdout + backends.stderr
    )
    commands = tox_commands(doc_files()["tox.ini"])
    # No -p: pytest loads the kit through its pytest11 entry point, the backend comes from [pytest].
    assert commands == [["pytest", "--pyargs", "devicehost.testing.conformance"], ["pytest"]]
    run_testenv(venv, project, doc_files()["tox.ini"], timeout=60)


def public_modules() -> list[str]:
    """The modules whose ``__all__`` is public API: ``devicehost``, the modules its ``__all__``
    names, the kit ``devicehost.testing`` and every kit module with an ``__all__`` of its own."""
    import importlib.util
    import pkgutil
    import types

    import devicehost
    import devicehost.testing

    modules = ["devicehost", "devicehost.testing"]
    modules += [
        f"devicehost.{n}" for n in devicehost.__all__ if isinstance(getattr(devicehost, n), types.ModuleType)
    ]
    for info in pkgutil.iter_modules(devicehost.testing.__path__, "devicehost.testing."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None
        assert spec.origin is not None
        if re.search(
            r"^(__all__ =|from \S+ import __all__ as __all__)", Path(spec.origin).read_text(), re.MULTILINE
        ):
            modules.append(info.name)
    return sorted(modules)


def test_stability_lists_every_public_name() -> None:
    """docs/stability.md has one row per public module, and the row names every name of the
    module's ``__all__`` (``devicehost`` itself included)."""
    import importlib

    doc = (ROOT / "docs" / "stability.md").read_text()
    rows = dict(re.findall(r"^\| `(devicehost[.\w]*)` \| (.*) \|$", doc, re.MULTILINE))
    modules = public_modules()
    assert {"devicehost", "devicehost.cdi", "devicehost.policies", "devicehost.testing.cluster"} <= set(
        modules
    )
    assert sorted(rows) == modules, "docs/stability.md's rows are not the public modules"
    for module in modules:
        public = importlib.import_module(module).__all__
        missing = [n for n in public if f"`{n}`" not in rows[module]]
        assert not missing, f"docs/stability.md's {module} row leaves out {missing}"
