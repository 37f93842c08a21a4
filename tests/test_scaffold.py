"""``devicehost new-backend``: the project it writes installs from a devicehost wheel into a fresh
venv, is listed by ``devicehost backends``, and passes conformance and its own tests.

The end-to-end test is marked ``scaffold`` (tox env ``scaffold``); the rest are quick.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from projects import run_testenv, tox_commands

from devicehost.host.cli import main
from devicehost.host.cli.cmd_new_backend import names_for

pytestmark = pytest.mark.usefixtures("logging_untouched")

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    ".gitignore",
    "README.md",
    "conformance.yaml",
    "pyproject.toml",
    "src/devicehost_acme_labs/__init__.py",
    "tests/test_devicehost_acme_labs.py",
    "tox.ini",
}


def test_it_writes_one_complete_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "proj"
    assert main(["new-backend", "acme-labs", "--resource", "acme.com/widget", "--dir", str(target)]) == 0
    written = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    assert written == FILES
    text = "".join(p.read_text() for p in target.rglob("*") if p.is_file())
    assert "${" not in text  # every placeholder filled
    pyproject = (target / "pyproject.toml").read_text()
    assert 'acme-labs = "devicehost_acme_labs:AcmeLabsBackend"' in pyproject
    assert '[project.entry-points."devicehost.backends"]' in pyproject
    assert "wrote backend 'acme-labs' (acme.com/widget)" in capsys.readouterr().out


def test_the_default_dir_is_named_after_the_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new-backend", "acme", "--resource", "acme.com/widget"]) == 0
    assert (tmp_path / "devicehost-acme" / "src" / "devicehost_acme" / "__init__.py").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Acme", "--resource", "acme.com/w"], "backend name 'Acme' must be lowercase letters and digits"),
        (["a--b", "--resource", "acme.com/w"], "backend name 'a--b' must be lowercase"),
        (["1acme", "--resource", "acme.com/w"], "starting with a letter"),
        (["acme", "--resource", "widget"], "--resource: resource name 'widget' must contain exactly one '/'"),
        (["acme", "--resource", "kubernetes.io/w"], "must not be in the kubernetes.io domain"),
    ],
)
def test_a_bad_name_or_resource_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["new-backend", *args, "--dir", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_a_directory_in_use_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["new-backend", "acme", "--resource", "acme.com/w", "--dir", str(tmp_path)]) == 2
    assert f"{tmp_path} already exists and is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_the_pin_allows_this_minor_release_only() -> None:
    from devicehost import __version__

    major, minor = __version__.split(".")[:2]
    assert names_for("acme", "acme.com/w").pin == f">={major}.{minor},<{major}.{int(minor) + 1}"


@pytest.mark.scaffold
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_scaffold_installs_from_a_wheel_and_passes_its_tests(short_tmp: Path) -> None:
    project = short_tmp / "devicehost-acme"
    assert main(["new-backend", "acme", "--resource", "acme.com/widget", "--dir", str(project)]) == 0
    wheels = project / "wheels"  # where the scaffold's README and tox.ini look for devicehost
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert built.returncode == 0, built.stderr
    assert [p.name.split("-")[0] for p in wheels.glob("*.whl")] == ["devicehost"]
    venv = short_tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    installed = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--find-links",
            str(wheels),
            f"{project}[testing]",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert installed.returncode == 0, installed.stderr
    backends = subprocess.run(
        [str(venv / "bin" / "devicehost"), "backends"], capture_output=True, text=True, timeout=30
    )
    assert "acme  (devicehost-acme 0.1.0, devicehost_acme:AcmeBackend)  loaded" in backends.stdout, (
        backends.stdout + backends.stderr
    )
    assert "acme.com/widget: 4 devices (4 healthy)" in backends.stdout
    tox_ini = (project / "tox.ini").read_text()
    # Plain pytest, as a vendor types it: the kit loads through its pytest11 entry point and the
    # backend and its settings come from tox.ini's [pytest] (it was `fixture 'kubelet' not found`).
    assert tox_commands(tox_ini) == [["pytest", "--pyargs", "devicehost.testing.conformance"], ["pytest"]]
    conformance, own = run_testenv(venv, project, tox_ini, timeout=120)
    # every conformance check applies to the scaffold but dra-counters' (no counter sets), named
    assert ", 1 skipped, " in conformance, conformance
    assert (
        "[dra-counters] test_counters_are_declared_and_fit: no resource declares counter_sets" in conformance
    )
    assert "skipped" not in own
