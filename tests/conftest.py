"""Shared fixtures: a short temp dir for unix sockets and a running kubelet stand-in."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devicehost.testing.kubelet import KubeletStandIn


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
