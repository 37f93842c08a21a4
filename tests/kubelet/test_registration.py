"""Registration as the real kubelet sees it: on ``kubelet.sock`` and through ``plugins_registry``."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpharness import DpHarness, dpharness

from devicehost.testing import running_host

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(120)]

WIDGET = "example.com/widget"


async def test_the_kubelet_counts_every_device_registered_on_kubelet_sock(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    async with running_host(plugins_dir, ["example"], registration_mode="kubelet"):
        reached, count, _ = await kubelet.wait(WIDGET, 4)
        assert reached, f"allocatable {count}"
        report = await kubelet.capacity()
    assert report.capacity == {WIDGET: 4}
    assert report.allocatable == {WIDGET: 4}
    assert report.deleted == []


async def test_the_plugin_watcher_registers_the_host_by_its_socket(peer: Path, tmp_path: Path) -> None:
    plugins_dir, registry = tmp_path / "dp", tmp_path / "reg"
    async with (
        dpharness(peer, plugins_dir, plugins_registry=registry) as kubelet,
        running_host(plugins_dir, ["example"], registration_mode="watcher", plugins_registry_dir=registry),
    ):
        reached, count, _ = await kubelet.wait(WIDGET, 4)
        assert reached, f"allocatable {count}"
        # kubelet 1.32's device-plugin handler writes no DEPRECATION file (the stand-in did)
        assert not (plugins_dir / "DEPRECATION").exists()
        assert [p.name for p in registry.iterdir() if p.name.startswith("devicehost-")], (
            "no socket in the registry"
        )
        assert await kubelet.restart() > 0
        reached, count, _ = await kubelet.wait(WIDGET, 4)
        assert reached, f"after a kubelet restart, allocatable {count}"
        allocation = await kubelet.allocate("pod-1", WIDGET, 2)
    assert allocation.ok, allocation.error
    assert len(allocation.device_ids) == 2
