"""The real kubelet's device manager (``dpharness``), skipped with the reason when it is not here.

Run with ``tox -e kubelet`` (or ``pytest -m kubelet tests/kubelet``) and ``DEVICEHOST_KUBELET_PEER``
naming a kubelet harness: a dir holding the ``dpharness`` and ``stubplugin`` executables (not in
this repository; without it every test is skipped with the reason). Every module here is marked
``kubelet``, which the default envs deselect (``-m "not kubelet"`` in tox.ini).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dpharness import DpHarness, dpharness, peer_dir


@pytest.fixture(scope="session")
def peer() -> Path:
    """The dir holding dpharness and stubplugin; the test is skipped, with why, without it."""
    found, why = peer_dir()
    if found is None:
        pytest.skip(f"the real kubelet's device manager is not available: {why}")
    return found


@pytest.fixture
def plugins_dir(tmp_path: Path) -> Path:
    """The device-plugins dir the kubelet serves ``kubelet.sock`` in."""
    return tmp_path / "dp"


@pytest.fixture
async def kubelet(peer: Path, plugins_dir: Path) -> AsyncIterator[DpHarness]:
    """The kubelet 1.32 device manager, running, on ``plugins_dir``."""
    async with dpharness(peer, plugins_dir) as harness:
        yield harness
