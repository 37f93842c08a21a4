"""Allocation as the kubelet builds it: preferred allocation, pre-start, and its admission errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpharness import DpHarness
from hostfakes import TopologyBackend, running_host, widgets

import devicehost
from devicehost.testing import running_host as running_installed

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(120)]

WIDGET = "example.com/widget"
PACKED = "example.com/packed"


class HighestFirst(TopologyBackend):
    """Prefers the highest IDs, so the kubelet's own pick (lowest first) cannot pass for it."""

    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: devicehost.PreferredAllocationRequest) -> list[str]:
        self._record("devicehost_preferred_allocation")
        rest = [i for i in sorted(request.available, reverse=True) if i not in request.must_include]
        return [*request.must_include, *rest][: request.size]


class PreferenceBroken(TopologyBackend):
    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: devicehost.PreferredAllocationRequest) -> list[str]:
        raise RuntimeError("preferred broke")


class PreStartBroken(TopologyBackend):
    @devicehost.hookimpl
    def devicehost_pre_start_container(self, device_ids: tuple[str, ...]) -> None:
        raise RuntimeError("reset failed")


async def test_the_kubelet_builds_the_container_from_the_example_backend(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    async with running_installed(plugins_dir, ["example"], registration_mode="kubelet"):
        assert (await kubelet.wait(WIDGET, 4))[0]
        allocation = await kubelet.allocate("pod-1", WIDGET, 2)
        assert allocation.ok, allocation.error
        ids = sorted(allocation.device_ids)
        assert allocation.envs == {"EXAMPLE_WIDGETS": ",".join(ids)} or allocation.envs == {
            "EXAMPLE_WIDGETS": ",".join(reversed(ids))
        }
        assert allocation.mounts == [
            {"container_path": "/etc/example", "host_path": "/etc", "read_only": True}
        ]
        assert sorted(d["container_path"] for d in allocation.devices) == [f"/dev/{i}" for i in ids]
        assert {(d["host_path"], d["permissions"]) for d in allocation.devices} == {("/dev/null", "rw")}
        assert allocation.allocate_us > 0
        refused = await kubelet.allocate("pod-2", WIDGET, 3)  # only 2 left
        assert not refused.ok
        assert refused.stage == "allocate"
        assert "requested number of devices unavailable" in refused.error
        assert await kubelet.release("pod-1")
        again = await kubelet.allocate("pod-3", WIDGET, 4)
        assert again.ok, again.error


async def test_preferred_allocation_decides_and_pre_start_runs(kubelet: DpHarness, plugins_dir: Path) -> None:
    backend = HighestFirst(widgets(PACKED, 4))
    async with running_host(plugins_dir, {"packed": backend}, registration_mode="kubelet"):
        assert (await kubelet.wait(PACKED, 4))[0]
        allocation = await kubelet.allocate("pod-1", PACKED, 2)
        assert allocation.ok, allocation.error
        assert sorted(allocation.device_ids) == ["w2", "w3"]
        assert backend.count("devicehost_preferred_allocation") == 1
        assert [sorted(ids) for ids in backend.pre_started] == [["w2", "w3"]]
        assert sorted(allocation.envs["IDS"].split(",")) == ["w2", "w3"]
        # must-include: nothing; the next pod is offered what is left and the backend still picks
        second = await kubelet.allocate("pod-2", PACKED, 1)
        assert second.ok, second.error
        assert second.device_ids == ["w1"]
        assert len(backend.pre_started) == 2


async def test_a_raising_preferred_allocation_hook_fails_admission(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    """The kubelet does not fall back on its own pick: the pod is refused (the stand-in agrees)."""
    backend = PreferenceBroken(widgets(PACKED, 2))
    async with running_host(plugins_dir, {"packed": backend}, registration_mode="kubelet"):
        assert (await kubelet.wait(PACKED, 2))[0]
        refused = await kubelet.allocate("pod-1", PACKED, 1)
        assert not refused.ok
        assert refused.stage == "allocate"
        assert refused.error.startswith(
            "device plugin GetPreferredAllocation rpc failed with err: rpc error: "
        )
        assert "preferred broke" in refused.error
        assert backend.count("devicehost_allocate") == 0
        assert (await kubelet.capacity()).allocatable == {PACKED: 2}


async def test_a_raising_pre_start_hook_fails_the_container_and_keeps_its_devices(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    backend = PreStartBroken(widgets(PACKED, 2))
    async with running_host(plugins_dir, {"packed": backend}, registration_mode="kubelet"):
        assert (await kubelet.wait(PACKED, 2))[0]
        failed = await kubelet.allocate("pod-1", PACKED, 1)
        assert not failed.ok
        assert failed.stage == "runopts"
        assert failed.error.startswith("device plugin PreStartContainer rpc failed with err: rpc error: ")
        assert "reset failed" in failed.error
        refused = await kubelet.allocate("pod-2", PACKED, 2)  # pod-1 holds one: Allocate had succeeded
        assert (
            refused.error
            == f"requested number of devices unavailable for {PACKED}. Requested: 2, Available: 1"
        )
