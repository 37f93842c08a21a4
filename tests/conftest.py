"""Shared fixtures: a short temp dir for unix sockets and a running kubelet stand-in; every test
writes CDI specs in a temporary dir and fails if it changed the machine's CDI dirs (cdi_guard)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cdi_guard import cdi_in_tmp, machine_cdi_dirs_untouched
from hostfakes import install_test_backends

from devicehost.testing.kubelet import KubeletStandIn

__all__ = ["cdi_in_tmp", "machine_cdi_dirs_untouched"]  # autouse fixtures, for every test here


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir short enough for unix socket paths (pytest's tmp_path can be too long)."""
    path = Path(tempfile.mkdtemp(prefix="dh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin_dir(short_tmp: Path) -> Path:
    """The device-plugins dir of one test."""
    directory = short_tmp / "dp"
    directory.mkdir()
    return directory


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletStandIn]:
    """A kubelet stand-in serving kubelet.sock in ``plugin_dir``."""
    async with KubeletStandIn(plugin_dir) as stand_in:
        yield stand_in


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Test backends (a good one, broken ones) installed as distributions on sys.path, for one test."""
    site = tmp_path / "site"
    install_test_backends(site)
    monkeypatch.syspath_prepend(str(site))
    yield site
    for module in ("dh_good", "dh_broken", "dh_asyncy", "dh_typo"):
        sys.modules.pop(module, None)


@pytest.fixture
def logging_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands run in-process leave logging as it is: configure_logging would cache every
    logger of the session with its processors, and later tests could no longer capture logs."""
    from devicehost.host import logs

    monkeypatch.setattr(logs, "configure_logging", lambda *args, **kwargs: None)
