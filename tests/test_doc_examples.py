"""Every code example in README.md and docs/*.md is run or checked here: none can rot unseen.

Each fenced block is claimed by exactly one check (a block no check claims fails the suite):
shell commands are split and dispatched by program (``devicehost`` lines parsed by the real
parser, the conformance command run against the documented backend, the rest checked for what
they name); Python blocks run; the README's backend example is pip-installed and passes the
conformance kit; the README's config example passes ``devicehost config check``. The
walk-through's ``file=`` blocks and the hook signatures are run and compared by
``tests/test_contract_docs.py``.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import devicehost
from devicehost.host.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
QUICKSTART = "python3 -m venv .venv && .venv/bin/pip install -e . -e plugins/devicehost-example"
TEST_COMMAND = (
    "python3 -m venv .venv-tox && .venv-tox/bin/pip install -r requirements/tox.txt && .venv-tox/bin/tox"
)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    info: str
    text: str

    @property
    def lang(self) -> str:
        return self.info.split(" ", 1)[0]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(str(path.relative_to(ROOT)), line, match[1].strip(), match[2]))
    return found


def commands(block: Block) -> list[list[str]]:
    """The block's shell commands, continuations joined, comments dropped, split at ``&&``."""
    joined = block.text.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while "&&" in words:
            at = words.index("&&")
            found.append(words[:at])
            words = words[at + 1 :]
        if words:
            found.append(words)
    return found


def is_shell(block: Block) -> bool:
    return block.lang in ("sh", "") and not block.text.startswith("devicehost-acme/")


def claim(block: Block) -> str:
    """Which check covers the block."""
    if "file=" in block.info:
        return "walk-through file (test_contract_docs)"
    if block.doc == "docs/hooks.md" and re.fullmatch(r"def \w+\(.*\) -> .*\n", block.text):
        return "hook signature (test_contract_docs)"
    if block.text.startswith("devicehost-acme/"):
        return "walk-through layout"
    if is_shell(block):
        return "shell"
    if block.lang == "python" and block.doc == "README.md":
        return "README backend"
    if block.lang == "ini" and block.doc == "README.md":
        return "README backend"
    if block.lang == "python":
        return "python"
    if block.lang == "yaml" and block.doc == "README.md":
        return "config"
    if block.lang == "text" and block.doc == "docs/stability.md":
        return "pins"
    if block.lang == "text" and block.doc == "docs/dra.md":
        return "webhook refusal (test_webhook)"
    return ""


def of_kind(kind: str) -> list[Block]:
    return [b for b in blocks() if claim(b) == kind]


def test_every_example_is_claimed_by_a_check() -> None:
    unclaimed = [str(b) for b in blocks() if not claim(b)]
    assert unclaimed == []
    assert len(of_kind("README backend")) == 2
    assert of_kind("shell")
    assert of_kind("python")
    assert of_kind("config")


def test_the_walkthrough_layout_lists_its_files() -> None:
    (layout,) = of_kind("walk-through layout")
    files = [b.info.split("file=", 1)[1] for b in blocks() if "file=" in b.info]
    assert files
    assert [f for f in files if f.rsplit("/", 1)[-1] not in layout.text] == []


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    first, second = of_kind("shell")[:2]
    assert first.text.strip() == f"{QUICKSTART} && .venv/bin/devicehost run --simulate-kubelet"
    assert second.text.strip() == TEST_COMMAND
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


SHELL = [(str(b), words) for b in of_kind("shell") for words in commands(b)]


@pytest.mark.parametrize(("where", "words"), SHELL, ids=[f"{w}:{' '.join(c)[:40]}" for w, c in SHELL])
def test_shell_command(where: str, words: list[str], tmp_path: Path) -> None:
    program = Path(words[0]).name
    if program == "devicehost":
        assert words[0] in ("devicehost", ".venv/bin/devicehost")
        build_parser().parse_args(words[1:])  # exits 2 on anything it does not know
    elif program in ("python", "python3"):
        assert words[1:3] in (["-m", "venv"], ["-m", "build"]) or words[1:4] == ["-m", "pip", "wheel"], words
    elif program == "git":
        assert words[1] == "clone", words
    elif program == "pip":
        targets = [w.split("[")[0] for w in words[2:] if not w.startswith("-")]
        base = ROOT if where.startswith("README") else None
        for target in targets if base else []:
            assert (base / target).exists(), target
    elif program == "tox":
        assert words == [".venv-tox/bin/tox"]
        assert (ROOT / "tox.ini").is_file()
    elif words[:2] == [".", ".venv/bin/activate"]:
        assert QUICKSTART.startswith("python3 -m venv .venv ")
    elif program == "pytest":
        assert words[1:5] == ["-p", "devicehost.testing.plugin", "--pyargs", "devicehost.testing.conformance"]
    elif program in ("docker", "kubectl", "kustomize", "cd"):
        named = [w for w in words if w.startswith(("deploy/", "-k")) or w == "."]
        for word in named:
            assert word in ("-k", ".") or (ROOT / word).exists(), word
        if program == "docker" and words[1] == "build":
            assert "ARG BACKENDS" in (ROOT / "Dockerfile").read_text()
    else:
        pytest.fail(f"{where}: no check knows the command {words[0]!r}")


def test_the_documented_pins_admit_this_release() -> None:
    (block,) = of_kind("pins")
    for line in block.text.split():
        requirement = Requirement(line)
        assert requirement.name == "devicehost"
        assert requirement.specifier.contains(devicehost.__version__), line


@pytest.mark.parametrize("block", of_kind("python"), ids=str)
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.text)
    runpy.run_path(str(script), run_name="doc_example")


def test_the_readme_config_example_passes_config_check(tmp_path: Path) -> None:
    (block,) = of_kind("config")
    config = tmp_path / "config.yaml"
    config.write_text(block.text)
    result = subprocess.run(
        [sys.executable, "-m", "devicehost", "config", "check", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("DEVICEHOST_")},
    )
    assert result.returncode == 0, result.stdout + result.stderr


PYPROJECT = '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_readme_backend_installs_and_passes_conformance(short_tmp: Path) -> None:
    source, setup_cfg = of_kind("README backend")
    module = re.search(r"py_modules = (\w+)", setup_cfg.text)
    assert module is not None
    project = short_tmp / "devicehost-acme"
    project.mkdir()
    (project / f"{module[1]}.py").write_text(source.text)
    (project / "setup.cfg").write_text(setup_cfg.text)
    (project / "pyproject.toml").write_text(PYPROJECT)  # "a pyproject.toml that holds only [build-system]"
    site = short_tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    installed = subprocess.run([*pip, "--target", str(site), str(project)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVICEHOST_", "PYTEST_"))}
    env["PYTHONPATH"] = str(site)
    env["COLUMNS"] = "300"
    listed = subprocess.run(
        [sys.executable, "-m", "devicehost", "backends"], capture_output=True, text=True, env=env, timeout=60
    )
    assert re.search(r"^acme .*loaded", listed.stdout, re.MULTILINE), listed.stdout + listed.stderr
    (command,) = [words for where, words in SHELL if where.startswith("README") and words[0] == "pytest"]
    strict = ["-W", "error", "-o", "asyncio_default_fixture_loop_scope=function"]
    result = subprocess.run(
        [sys.executable, "-m", *command, *strict],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
