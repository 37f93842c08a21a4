"""The NVIDIA backend's parts on their own: what a container gets (``allocation``), which IDs
are preferred (``topology``), GPU health from events and checks (``health``), and the backend
class (``backend``) over the fake NVML."""

from __future__ import annotations

from collections.abc import Mapping

from devicehost import DeviceSpec, Health
from devicehost_nvidia.allocation import CONTROL_DEVICES, VISIBLE_DEVICES_ENV, container_allocation
from devicehost_nvidia.backend import NvidiaBackend
from devicehost_nvidia.fake import FakeNvml, fake_gpus
from devicehost_nvidia.health import HealthWatcher
from devicehost_nvidia.inventory import Gpu
from devicehost_nvidia.nvml import EventKind, GpuEvent, GpuInfo
from devicehost_nvidia.topology import preferred


def gpu(index: int, numa_node: int) -> Gpu:
    info = GpuInfo(index, f"GPU-{index}", "Fake", 2**30, index, f"0000:{index + 1:02x}:00.0", numa_node)
    return Gpu(info, numa_node)


def test_a_container_gets_its_gpus_by_environment_or_cdi_name_and_optionally_the_nodes() -> None:
    gpus = [gpu(0, 0), gpu(3, 0)]
    plain = container_allocation(gpus, cdi_kind=None, device_specs=False)
    assert (plain.envs, plain.cdi_devices, plain.devices) == ({VISIBLE_DEVICES_ENV: "GPU-0,GPU-3"}, [], [])
    named = container_allocation(gpus, cdi_kind="nvidia.com/gpu", device_specs=True)
    assert (named.envs, named.cdi_devices) == ({}, ["nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-3"])
    paths = ["/dev/nvidia0", "/dev/nvidia3", *CONTROL_DEVICES]
    assert named.devices == [DeviceSpec(container_path=p, host_path=p) for p in paths]


def test_the_preferred_gpus_share_a_numa_node_then_nvlink_then_spread_replicas() -> None:
    gpus = {n: gpu(n, n // 2) for n in range(4)}  # GPUs 0,1 on node 0; 2,3 on node 1
    gpu_of = {f"{n}::{r}": gpus[n] for n in range(4) for r in range(2)}
    linked = {frozenset(("GPU-2", "GPU-3"))}

    def nvlinked(a: str, b: str) -> bool:
        return frozenset((a, b)) in linked

    two = preferred(list(gpu_of), [], 2, gpu_of, nvlinked)
    assert {gpu_of[i].info.index for i in two} == {2, 3}  # one NUMA node and NVLinked
    with_must = preferred(list(gpu_of), ["0::1"], 2, gpu_of, nvlinked)
    assert with_must[0] == "0::1"
    assert {gpu_of[i].info.index for i in with_must} == {0, 1}  # the must-include GPU's node
    spread = preferred(list(gpu_of), [], 4, gpu_of, nvlinked)
    assert sorted(gpu_of[i].info.index for i in spread) == [0, 1, 2, 3]  # one replica per GPU


def test_a_gpu_turns_unhealthy_on_a_critical_xid_and_recovers_after_the_interval() -> None:
    clock = [100.0]
    changes: list[Mapping[str, Health]] = []
    watcher = HealthWatcher(
        FakeNvml(fake_gpus(2)),
        ["GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000001"],
        ignored_xids={13},
        recovery_interval=30.0,
        on_change=lambda change: changes.append(dict(change)),
        clock=lambda: clock[0],
    )
    first, second = sorted(watcher.uuids)
    watcher.handle(GpuEvent(first, EventKind.XID, 13))  # ignored
    watcher.handle(GpuEvent(first, EventKind.XID, 79))  # fallen off the bus
    assert watcher.current() == {first: Health.UNHEALTHY, second: Health.HEALTHY}
    clock[0] += 29
    assert watcher.health()[first] is Health.UNHEALTHY
    clock[0] += 1
    assert watcher.health()[first] is Health.HEALTHY
    watcher.handle(GpuEvent(None, EventKind.DOUBLE_BIT_ECC, 0))  # unattributed: every GPU
    assert changes == [
        {first: Health.UNHEALTHY},
        {first: Health.HEALTHY},
        {first: Health.UNHEALTHY, second: Health.UNHEALTHY},
    ]


def test_the_backend_discovers_the_fake_gpus_and_allocates_them() -> None:
    backend = NvidiaBackend(nvml=FakeNvml(fake_gpus(2)))
    backend.devicehost_configure({})
    (resource,) = backend.devicehost_discover()
    ids = tuple(d.id for d in resource.devices)
    assert resource.name == "nvidia.com/gpu"
    assert len(ids) == 2
    allocation = backend.devicehost_allocate(resource.name, ids[:1])
    assert allocation.envs == {VISIBLE_DEVICES_ENV: ids[0]}
