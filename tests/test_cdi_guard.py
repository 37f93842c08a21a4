"""The suite fails a test that writes the machine's CDI dirs (tests/support/cdi_guard.py).

The guard runs in a pytest of its own over planted tests, watching a temporary dir in place of
``/var/run/cdi`` and ``/etc/cdi``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cdi_guard

from devicehost import cdi

PLANTED = """
from pathlib import Path

from devicehost import cdi

WATCHED = Path({watched!r})
SPEC = cdi.Spec(kind="example.com/planted", devices=[cdi.Device("a", cdi.ContainerEdits(env={{"A": "1"}}))])


def test_leaves_the_machine_dir_alone():
    assert (WATCHED / "kept.json").exists()


def test_writes_a_spec_in_the_machine_dir():
    cdi.write_spec(SPEC, WATCHED)


def test_removes_a_spec_from_the_machine_dir():
    (WATCHED / "kept.json").unlink()


def test_writes_where_no_dir_is_named():
    assert WATCHED not in cdi.write_spec(SPEC).parents
"""


def test_a_test_that_changes_the_machine_cdi_dir_fails_naming_what_it_changed(tmp_path: Path) -> None:
    watched = tmp_path / "machine-cdi"
    watched.mkdir()
    (watched / "kept.json").write_text("{}")
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text("from cdi_guard import cdi_in_tmp, machine_cdi_dirs_untouched\n")
    (project / "test_planted.py").write_text(PLANTED.format(watched=str(watched)))
    support = Path(cdi_guard.__file__).parent
    env = {**os.environ, cdi_guard.WATCHED_ENV: str(watched), "PYTHONPATH": str(support), "COLUMNS": "1000"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "test_planted.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    failed = {
        line.split(" - ")[0].removeprefix("ERROR test_planted.py::"): line.split(" - ", 1)[1]
        for line in run.stdout.splitlines()
        if line.startswith("ERROR ")
    }
    said = "Failed: the test changed the machine's CDI dirs: "
    assert failed == {
        "test_writes_a_spec_in_the_machine_dir": f"{said}changed {watched}; "
        f"created {watched}/devicehost-example.com_planted.json",
        "test_removes_a_spec_from_the_machine_dir": f"{said}changed {watched}; removed {watched}/kept.json",
    }, run.stdout
    assert run.stdout.rstrip().splitlines()[-1].startswith("4 passed, 2 errors"), run.stdout
    assert run.returncode == 1


def test_this_test_writes_specs_named_with_no_dir_in_its_own_temporary_dir(cdi_in_tmp: Path) -> None:
    device = cdi.Device("a", cdi.ContainerEdits(env={"A": "1"}))
    path = cdi.write_spec(cdi.Spec(kind="example.com/here", devices=[device]))
    assert path.parent == cdi_in_tmp
    assert os.environ["DEVICEHOST_CDI_DIR"] == str(cdi_in_tmp)  # what a devicehost child reads
