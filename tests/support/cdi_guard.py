"""Tests write CDI specs only in their own temporary dirs, never in the machine's CDI dirs.

Two fixtures, both autouse where a conftest imports them (tests/conftest.py, plugins/conftest.py;
tests/e2e/conftest.py turns both off: its cluster runs on this machine and writes the node's CDI dir):

- ``cdi_in_tmp`` points :mod:`devicehost.cdi`'s default dir and ``DEVICEHOST_CDI_DIR`` (read by a
  ``devicehost`` child process; :func:`child_environ` keeps it) at a temporary dir for the test,
  so code that names no dir writes there;
- ``machine_cdi_dirs_untouched`` takes the names and mtimes under ``/var/run/cdi`` and ``/etc/cdi``
  before and after each test and fails the test that changed them (a spec written, removed or
  rewritten; a dir created). On a node with a CDI runtime those dirs decide what containers get.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicehost import cdi

MACHINE_CDI_DIRS = (Path("/var/run/cdi"), Path("/etc/cdi"))
WATCHED_ENV = "DEVICEHOST_TEST_WATCHED_CDI_DIRS"
"""Overrides :data:`MACHINE_CDI_DIRS` (``os.pathsep``-separated): for the guard's own test only."""


CDI_ENV = "DEVICEHOST_CDI_DIR"


def child_environ(*strip: str) -> dict[str, str]:
    """This process's environment for a child process: no ``DEVICEHOST_*`` variable of the shell
    running the tests (nor any of the ``strip`` prefixes), but the test's ``DEVICEHOST_CDI_DIR``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVICEHOST_", *strip))}
    if CDI_ENV in os.environ:
        env[CDI_ENV] = os.environ[CDI_ENV]
    return env


def watched_dirs() -> tuple[Path, ...]:
    """The dirs no test may change."""
    named = os.environ.get(WATCHED_ENV)
    return tuple(Path(p) for p in named.split(os.pathsep)) if named else MACHINE_CDI_DIRS


def listing(directories: tuple[Path, ...]) -> dict[str, float]:
    """Every dir and file under ``directories`` (the dirs themselves included) with its mtime."""
    found: dict[str, float] = {}
    for directory in directories:
        if not directory.exists():
            continue
        found[str(directory)] = directory.stat().st_mtime
        for path in directory.rglob("*"):
            try:
                found[str(path)] = path.lstat().st_mtime
            except FileNotFoundError:  # removed while listed: it is not there
                continue
    return found


def changes(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """What changed between two listings, one line each, sorted."""
    lines = [f"created {p}" for p in after.keys() - before.keys()]
    lines += [f"removed {p}" for p in before.keys() - after.keys()]
    lines += [f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(lines)


@pytest.fixture(autouse=True)
def cdi_in_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary CDI dir that is ``devicehost.cdi``'s default and ``DEVICEHOST_CDI_DIR`` for one test."""
    path = Path(tempfile.mkdtemp(prefix="dh-cdi-", dir="/tmp"))
    previous = cdi.default_dir()
    cdi.set_default_dir(path)
    monkeypatch.setenv(CDI_ENV, str(path))
    yield path
    cdi.set_default_dir(previous)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def machine_cdi_dirs_untouched() -> Iterator[None]:
    """Fails the test (at its teardown) that changed what the machine's CDI dirs hold."""
    directories = watched_dirs()
    before = listing(directories)
    yield
    changed = changes(before, listing(directories))
    if changed:
        pytest.fail("the test changed the machine's CDI dirs: " + "; ".join(changed), pytrace=False)
