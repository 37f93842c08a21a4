"""The nvidia backend's hooks, called directly against the fake NVML."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devicehost import Device, Health, PreferredAllocationRequest
from devicehost.hookspecs import rules
from devicehost_nvidia import NvidiaBackend
from devicehost_nvidia.fake import FakeGpu, FakeNvml, fake_gpus
from devicehost_nvidia.nvml import EventKind, NvmlUnavailable, PynvmlNvml, normalize_bus_id

RESOURCE = "nvidia.com/gpu"
WAIT_S = 5.0


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Notifier:
    """Records set_health calls and lets a test wait for one, with a bounded timeout."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.health: dict[str, Health] = {}
        self.calls: list[dict[str, Health]] = []

    def set_health(self, health: Mapping[str, Health]) -> None:
        with self._changed:
            self.calls.append(dict(health))
            self.health.update(health)
            self._changed.notify_all()

    def set_devices(self, devices: Sequence[Device]) -> None:
        raise AssertionError("the nvidia backend never replaces the device list")

    def rediscover(self) -> None:
        raise AssertionError("the nvidia backend never asks for rediscovery")

    def wait_for(self, predicate: Callable[[dict[str, Health]], bool]) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self.health), timeout=WAIT_S)


@pytest.fixture
def clock() -> Clock:
    return Clock()


Make = Callable[..., tuple[NvidiaBackend, FakeNvml]]


@pytest.fixture
def make(clock: Clock) -> Iterator[Make]:
    """Build a configured backend on a FakeNvml; stop what the test started."""
    started: list[NvidiaBackend] = []

    def build(gpus: Sequence[FakeGpu] = (), **settings: Any) -> tuple[NvidiaBackend, FakeNvml]:
        nvml = FakeNvml(gpus or fake_gpus(2))
        backend = NvidiaBackend(nvml, clock=clock, health_wait_ms=20)
        backend.devicehost_configure(settings)
        started.append(backend)
        return backend, nvml

    yield build
    for backend in started:
        backend.devicehost_stop(RESOURCE)


def ids(backend: NvidiaBackend) -> list[str]:
    (resource,) = backend.devicehost_discover()
    return [device.id for device in resource.devices]


def poll(backend: NvidiaBackend, devices: tuple[Device, ...]) -> Mapping[str, Health]:
    health = backend.devicehost_health(RESOURCE, devices)
    assert health is not None
    return health


def started(backend: NvidiaBackend) -> Notifier:
    backend.devicehost_discover()
    notifier = Notifier()
    backend.devicehost_start(RESOURCE, notifier)
    return notifier


# Discovery


def test_discover_uuid_strategy_one_device_per_gpu_with_numa(make: Make) -> None:
    backend, nvml = make(fake_gpus(4, numa_nodes=2))
    (resource,) = backend.devicehost_discover()
    assert resource.name == RESOURCE
    assert [d.id for d in resource.devices] == [g.uuid for g in nvml.gpus()]
    assert [d.numa_nodes for d in resource.devices] == [(0,), (0,), (1,), (1,)]
    assert all(d.health is Health.HEALTHY for d in resource.devices)
    assert rules.device_ids_problem(d.id for d in resource.devices) is None


def test_discover_index_strategy_with_replicas(make: Make) -> None:
    backend, _ = make(fake_gpus(2), device_id_strategy="index", replicas=3)
    assert ids(backend) == ["0::0", "0::1", "0::2", "1::0", "1::1", "1::2"]


def test_uuid_replica_ids_stay_within_the_kubelet_limit(make: Make) -> None:
    backend, _ = make(fake_gpus(1), replicas=256)
    device_ids = ids(backend)
    assert len(device_ids) == 256
    assert rules.device_ids_problem(device_ids) is None


def test_numa_node_falls_back_to_sysfs(make: Make, tmp_path: Path) -> None:
    for bus_id, node in [("0000:3b:00.0", "1\n"), ("0000:5e:00.0", "-1\n")]:
        (tmp_path / "bus/pci/devices" / bus_id).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / bus_id / "numa_node").write_text(node)
    gpus = [
        FakeGpu("GPU-a", pci_bus_id="0000:3b:00.0", numa_node=None),
        FakeGpu("GPU-b", pci_bus_id="0000:5e:00.0", numa_node=None, minor=1),
        FakeGpu("GPU-c", pci_bus_id="0000:86:00.0", numa_node=None, minor=2),
        FakeGpu("GPU-d", pci_bus_id="0000:3b:00.0", numa_node=0, minor=3),
    ]
    backend, _ = make(gpus, sysfs_root=str(tmp_path))
    (resource,) = backend.devicehost_discover()
    # sysfs 1; sysfs -1 (no NUMA); no sysfs file; NVML's answer wins over sysfs.
    assert [d.numa_nodes for d in resource.devices] == [(1,), (), (), (0,)]


def test_bus_ids_are_normalized_to_the_sysfs_spelling() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0001:AF:00.1") == "0001:af:00.1"


def test_fake_gpus_from_settings_for_the_conformance_suite() -> None:
    backend = NvidiaBackend()
    backend.devicehost_configure(
        {"nvml": "fake", "fake_gpus": [{"uuid": "GPU-x", "numa_node": 1}, {"uuid": "GPU-y", "minor": 1}]}
    )
    (resource,) = backend.devicehost_discover()
    assert [(d.id, d.numa_nodes) for d in resource.devices] == [("GPU-x", (1,)), ("GPU-y", (0,))]


def test_entry_point_names_the_backend_class() -> None:
    (entry_point,) = [ep for ep in entry_points(group="devicehost.backends") if ep.name == "nvidia"]
    assert entry_point.load() is NvidiaBackend


# No driver


def test_no_driver_offers_nothing_and_logs_once_until_it_loads(clock: Clock) -> None:
    nvml = FakeNvml(fake_gpus(2), available=False)
    backend = NvidiaBackend(nvml, clock=clock)
    backend.devicehost_configure({})
    with capture_logs() as logs:
        assert backend.devicehost_discover() == []
        assert backend.devicehost_discover() == []
    assert [log["event"] for log in logs] == ["nvml_unavailable"]
    assert logs[0]["log_level"] == "warning"
    assert "Not Found" in logs[0]["detail"]
    nvml.set_available(True)
    assert len(ids(backend)) == 2


def test_nvml_error_on_rediscovery_keeps_the_gpus(make: Make) -> None:
    backend, nvml = make(fake_gpus(2))
    before = backend.devicehost_discover()
    nvml.set_broken()
    with capture_logs() as logs:
        assert backend.devicehost_discover() == before
    assert [(log["event"], log["log_level"]) for log in logs] == [("nvidia_discovery_failed", "error")]


def test_real_nvml_without_driver_raises_unavailable() -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable) as info:
        PynvmlNvml().init()
    assert info.value.code in (9, 12)  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND


# Health


def test_critical_xid_marks_every_replica_of_the_gpu_unhealthy(make: Make) -> None:
    backend, nvml = make(fake_gpus(2), replicas=2)
    notifier = started(backend)
    bad = nvml.gpus()[1].uuid
    nvml.inject(bad, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: len(h) == 2)
    assert notifier.health == {f"{bad}::0": Health.UNHEALTHY, f"{bad}::1": Health.UNHEALTHY}
    devices = backend.devicehost_discover()[0].devices
    assert {d.id for d in devices if d.health is Health.UNHEALTHY} == {f"{bad}::0", f"{bad}::1"}


def test_ignored_xids_leave_the_gpu_healthy(make: Make) -> None:
    backend, nvml = make(fake_gpus(2))
    notifier = started(backend)
    uuid = nvml.gpus()[0].uuid
    for xid in (13, 31, 43, 45, 68, 109):
        nvml.inject(uuid, EventKind.XID, xid)
    assert nvml.wait_handled()
    assert notifier.calls == []
    devices = backend.devicehost_discover()[0].devices
    assert set(poll(backend, devices).values()) == {Health.HEALTHY}


def test_ignored_xids_setting_replaces_the_default(make: Make) -> None:
    backend, nvml = make(fake_gpus(2), ignored_xids=[48])
    notifier = started(backend)
    first, second = (g.uuid for g in nvml.gpus())
    nvml.inject(first, EventKind.XID, 48)
    nvml.inject(second, EventKind.XID, 13)
    assert nvml.wait_handled()
    assert notifier.health == {second: Health.UNHEALTHY}


def test_double_bit_ecc_marks_the_gpu_unhealthy(make: Make) -> None:
    backend, nvml = make(fake_gpus(2))
    notifier = started(backend)
    bad = nvml.gpus()[0].uuid
    nvml.inject(bad, EventKind.DOUBLE_BIT_ECC)
    assert notifier.wait_for(lambda h: bad in h)
    assert notifier.health == {bad: Health.UNHEALTHY}


def test_event_without_a_gpu_marks_every_gpu_unhealthy(make: Make) -> None:
    backend, nvml = make(fake_gpus(3))
    notifier = started(backend)
    nvml.inject(None, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: len(h) == 3)
    assert set(notifier.health.values()) == {Health.UNHEALTHY}


def test_recovers_after_the_interval_without_new_events(make: Make, clock: Clock) -> None:
    backend, nvml = make(fake_gpus(2), recovery_check_interval=30)
    notifier = started(backend)
    bad = nvml.gpus()[0].uuid
    nvml.inject(bad, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: h.get(bad) is Health.UNHEALTHY)
    devices = backend.devicehost_discover()[0].devices
    clock.now += 29
    assert poll(backend, devices) == {
        bad: Health.UNHEALTHY,
        nvml.gpus()[1].uuid: Health.HEALTHY,
    }
    clock.now += 1
    assert poll(backend, devices)[bad] is Health.HEALTHY
    assert notifier.wait_for(lambda h: h.get(bad) is Health.HEALTHY)
    assert notifier.calls == [{bad: Health.UNHEALTHY}, {bad: Health.HEALTHY}]


def test_recovery_happens_in_the_event_thread_too(make: Make, clock: Clock) -> None:
    backend, nvml = make(fake_gpus(1), recovery_check_interval=5)
    notifier = started(backend)
    bad = nvml.gpus()[0].uuid
    nvml.inject(bad, EventKind.DOUBLE_BIT_ECC)
    assert notifier.wait_for(lambda h: h.get(bad) is Health.UNHEALTHY)
    clock.now += 5
    assert notifier.wait_for(lambda h: h.get(bad) is Health.HEALTHY)


def test_new_event_restarts_the_recovery_interval(make: Make, clock: Clock) -> None:
    backend, nvml = make(fake_gpus(1), recovery_check_interval=10)
    notifier = started(backend)
    bad = nvml.gpus()[0].uuid
    nvml.inject(bad, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: h.get(bad) is Health.UNHEALTHY)
    clock.now += 8
    nvml.inject(bad, EventKind.XID, 79)
    assert nvml.wait_handled()
    devices = backend.devicehost_discover()[0].devices
    clock.now += 8  # 16 s after the first event, 8 s after the second
    assert poll(backend, devices) == {bad: Health.UNHEALTHY}


def test_no_recovery_when_disabled(make: Make, clock: Clock) -> None:
    backend, nvml = make(fake_gpus(1), recovery_check_interval=None)
    notifier = started(backend)
    bad = nvml.gpus()[0].uuid
    nvml.inject(bad, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: h.get(bad) is Health.UNHEALTHY)
    clock.now += 10**6
    devices = backend.devicehost_discover()[0].devices
    assert poll(backend, devices) == {bad: Health.UNHEALTHY}


def test_gpu_nvml_no_longer_answers_for_is_unhealthy_until_it_does(make: Make, clock: Clock) -> None:
    backend, nvml = make(fake_gpus(2), recovery_check_interval=30)
    notifier = started(backend)
    lost = nvml.gpus()[1].uuid
    devices = backend.devicehost_discover()[0].devices
    nvml.set_lost(lost)
    assert poll(backend, devices)[lost] is Health.UNHEALTHY
    assert notifier.wait_for(lambda h: h.get(lost) is Health.UNHEALTHY)
    clock.now += 60
    assert poll(backend, devices)[lost] is Health.UNHEALTHY
    nvml.set_lost(lost, lost=False)
    clock.now += 1
    assert poll(backend, devices)[lost] is Health.UNHEALTHY  # bad 1 s ago
    clock.now += 30
    assert poll(backend, devices)[lost] is Health.HEALTHY


def test_gpu_without_event_support_stays_healthy(make: Make) -> None:
    gpus = [FakeGpu("GPU-old", events_supported=False), FakeGpu("GPU-new", minor=1)]
    backend, nvml = make(gpus)
    notifier = started(backend)
    devices = backend.devicehost_discover()[0].devices
    assert poll(backend, devices) == {
        "GPU-old": Health.HEALTHY,
        "GPU-new": Health.HEALTHY,
    }
    nvml.inject("GPU-new", EventKind.XID, 79)
    assert notifier.wait_for(lambda h: "GPU-new" in h)
    assert notifier.health == {"GPU-new": Health.UNHEALTHY}


def test_a_gpu_leaving_restarts_the_watcher_and_keeps_known_health(make: Make) -> None:
    backend, nvml = make(fake_gpus(3))
    notifier = started(backend)
    first, second, third = (g.uuid for g in nvml.gpus())
    nvml.inject(first, EventKind.XID, 79)
    assert notifier.wait_for(lambda h: first in h)
    nvml.remove_gpu(third)
    devices = backend.devicehost_discover()[0].devices
    assert [(d.id, d.health) for d in devices] == [(first, Health.UNHEALTHY), (second, Health.HEALTHY)]
    assert nvml.open_event_sets == 1
    nvml.inject(second, EventKind.DOUBLE_BIT_ECC)
    assert notifier.wait_for(lambda h: second in h)
    assert poll(backend, devices) == {first: Health.UNHEALTHY, second: Health.UNHEALTHY}


def test_no_event_set_falls_back_to_health_polls(make: Make) -> None:
    backend, nvml = make(fake_gpus(1))
    devices = backend.devicehost_discover()[0].devices
    nvml.set_broken()
    started(backend)
    assert nvml.open_event_sets == 0
    nvml.set_lost(devices[0].id)
    assert poll(backend, devices) == {devices[0].id: Health.UNHEALTHY}


def test_start_and_stop_are_idempotent(make: Make) -> None:
    backend, nvml = make(fake_gpus(1))
    notifier = started(backend)
    backend.devicehost_start(RESOURCE, notifier)
    assert nvml.open_event_sets == 1
    backend.devicehost_stop(RESOURCE)
    backend.devicehost_stop(RESOURCE)
    assert nvml.open_event_sets == 0
    assert backend.devicehost_health(RESOURCE, backend.devicehost_discover()[0].devices) is None


def test_health_checks_off_starts_no_watcher(make: Make) -> None:
    backend, nvml = make(fake_gpus(1), health_checks=False)
    started(backend)
    assert nvml.open_event_sets == 0
    assert backend.devicehost_health(RESOURCE, backend.devicehost_discover()[0].devices) is None


# Allocate


def test_allocate_sets_visible_devices_and_folds_replicas(make: Make) -> None:
    backend, nvml = make(fake_gpus(3), replicas=2)
    a, _, c = (g.uuid for g in nvml.gpus())
    allocation = backend.devicehost_allocate(RESOURCE, (f"{c}::1", f"{a}::0", f"{c}::0"))
    assert allocation.envs == {"NVIDIA_VISIBLE_DEVICES": f"{c},{a}"}
    assert list(allocation.cdi_devices) == []
    assert list(allocation.devices) == []
    assert rules.allocation_problem(allocation) is None


def test_allocate_index_strategy_still_passes_uuids(make: Make) -> None:
    backend, nvml = make(fake_gpus(2), device_id_strategy="index")
    allocation = backend.devicehost_allocate(RESOURCE, ("1",))
    assert allocation.envs == {"NVIDIA_VISIBLE_DEVICES": nvml.gpus()[1].uuid}


def test_allocate_cdi_names_instead_of_envs(make: Make) -> None:
    backend, nvml = make(fake_gpus(2), cdi=True)
    uuids = [g.uuid for g in nvml.gpus()]
    allocation = backend.devicehost_allocate(RESOURCE, tuple(uuids))
    assert list(allocation.cdi_devices) == [f"nvidia.com/gpu={u}" for u in uuids]
    assert allocation.envs == {}
    assert rules.allocation_problem(allocation) is None


def test_allocate_device_specs(make: Make) -> None:
    gpus = [FakeGpu("GPU-a", minor=0), FakeGpu("GPU-b", minor=7)]
    backend, _ = make(gpus, device_specs=True)
    allocation = backend.devicehost_allocate(RESOURCE, ("GPU-b",))
    assert [(d.container_path, d.host_path, d.permissions) for d in allocation.devices] == [
        (path, path, "rw")
        for path in ("/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    ]
    assert rules.allocation_problem(allocation) is None


def test_allocate_unknown_ids_are_named(make: Make) -> None:
    backend, nvml = make(fake_gpus(1))
    backend.devicehost_discover()
    with pytest.raises(ValueError, match=r"unknown nvidia\.com/gpu device IDs: GPU-nope, GPU-zz") as info:
        backend.devicehost_allocate(RESOURCE, (nvml.gpus()[0].uuid, "GPU-zz", "GPU-nope"))
    assert nvml.gpus()[0].uuid not in str(info.value)


# Preferred allocation


def prefer(
    backend: NvidiaBackend, available: Sequence[str], size: int, must: Sequence[str] = ()
) -> list[str]:
    request = PreferredAllocationRequest(tuple(available), tuple(must), size)
    answer = list(backend.devicehost_preferred_allocation(RESOURCE, request))
    assert rules.preferred_allocation_problem(answer, available, must, size) is None
    return answer


def test_preferred_packs_a_numa_node(make: Make) -> None:
    gpus = [FakeGpu(f"GPU-{n}", minor=n, numa_node=node) for n, node in enumerate([0, 1, 0, 1])]
    backend, _ = make(gpus, device_id_strategy="index")
    ids(backend)
    assert prefer(backend, ["0", "1", "2", "3"], 2) == ["0", "2"]
    assert prefer(backend, ["1", "2", "3"], 2) == ["1", "3"]


def test_preferred_must_include_pulls_in_its_numa_node(make: Make) -> None:
    gpus = [FakeGpu(f"GPU-{n}", minor=n, numa_node=node) for n, node in enumerate([0, 0, 1, 1])]
    backend, _ = make(gpus, device_id_strategy="index")
    ids(backend)
    assert sorted(prefer(backend, ["0", "1", "2", "3"], 2, must=["3"])) == ["2", "3"]
    assert sorted(prefer(backend, ["0", "1", "2", "3"], 3, must=["0", "3"])) in (
        ["0", "1", "3"],
        ["0", "2", "3"],
    )


def test_preferred_picks_nvlink_peers_within_a_numa_node(make: Make) -> None:
    gpus = [
        FakeGpu("GPU-0", minor=0),
        FakeGpu("GPU-1", minor=1, nvlink_peers=("GPU-3",)),
        FakeGpu("GPU-2", minor=2),
        FakeGpu("GPU-3", minor=3),
    ]
    backend, _ = make(gpus, device_id_strategy="index")
    ids(backend)
    assert sorted(prefer(backend, ["0", "1", "2", "3"], 2)) == ["1", "3"]
    assert sorted(prefer(backend, ["0", "1", "2", "3"], 2, must=["3"])) == ["1", "3"]
    assert sorted(prefer(backend, ["0", "2", "3"], 2)) == ["0", "2"]


def test_preferred_numa_comes_before_nvlink(make: Make) -> None:
    gpus = [
        FakeGpu("GPU-0", minor=0, numa_node=0, nvlink_peers=("GPU-2",)),
        FakeGpu("GPU-1", minor=1, numa_node=0),
        FakeGpu("GPU-2", minor=2, numa_node=1),
    ]
    backend, _ = make(gpus, device_id_strategy="index")
    ids(backend)
    assert prefer(backend, ["0", "1", "2"], 2) == ["0", "1"]


def test_preferred_with_replicas_spreads_over_the_least_loaded_gpus(make: Make) -> None:
    backend, _ = make(fake_gpus(3), device_id_strategy="index", replicas=4)
    ids(backend)
    available = ["0::0", "0::1", "0::2", "0::3", "1::3", "2::1", "2::2"]
    assert prefer(backend, available, 2) == ["0::0", "2::1"]
    assert prefer(backend, available, 4) == ["0::0", "1::3", "2::1", "0::1"]
    assert prefer(backend, available, 2, must=["1::3"]) == ["1::3", "0::0"]


def test_preferred_large_node_uses_the_greedy_search(make: Make) -> None:
    backend, _ = make(fake_gpus(16, numa_nodes=2), device_id_strategy="index")
    ids(backend)
    answer = prefer(backend, [str(n) for n in range(16)], 8, must=["9"])
    assert sorted(answer, key=int) == [str(n) for n in range(8, 16)]


def test_preferred_unknown_ids_are_named(make: Make) -> None:
    backend, _ = make(fake_gpus(1), device_id_strategy="index")
    ids(backend)
    with pytest.raises(ValueError, match=r"unknown nvidia\.com/gpu device IDs: 7$"):
        prefer(backend, ["0", "7"], 1)


# Settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"resource_name": "gpu"}, r"settings\.resource_name: .*exactly one '/'"),
        ({"resource_name": "kubernetes.io/gpu"}, r"settings\.resource_name: .*kubernetes\.io"),
        ({"device_id_strategy": "mig"}, r"settings\.device_id_strategy: Input should be 'uuid' or 'index'"),
        ({"replicas": 0}, r"settings\.replicas: .*greater than or equal to 1"),
        ({"recovery_check_interval": 0}, r"settings\.recovery_check_interval: .*greater than 0"),
        ({"ignored_xids": [13, "x"]}, r"settings\.ignored_xids\.1: "),
        ({"cdi_kind": "gpu"}, r"settings\.cdi_kind: .*not a CDI kind"),
        ({"resourceName": "nvidia.com/gpu"}, r"settings\.resourceName: Extra inputs are not permitted"),
        ({"fake_gpus": [{"uuid": "GPU-x"}]}, r"fake_gpus needs nvml: fake"),
        ({"nvml": "fake", "fake_gpus": [{"uuid": "GPU-x", "bogus": 1}]}, r"settings\.fake_gpus\.0\.bogus"),
    ],
)
def test_settings_errors_name_the_field(make: Make, settings: dict[str, Any], message: str) -> None:
    backend, _ = make(fake_gpus(1), replicas=2)
    with pytest.raises(ValueError, match=message):
        backend.devicehost_configure(settings)
    assert len(ids(backend)) == 2  # the previous settings stay


def test_defaults(make: Make) -> None:
    backend, nvml = make(fake_gpus(1))
    (resource,) = backend.devicehost_discover()
    assert resource.name == "nvidia.com/gpu"
    assert [d.id for d in resource.devices] == [nvml.gpus()[0].uuid]
    allocation = backend.devicehost_allocate(RESOURCE, (nvml.gpus()[0].uuid,))
    assert set(allocation.envs) == {"NVIDIA_VISIBLE_DEVICES"}
    assert not allocation.devices


def test_custom_resource_name_is_served(make: Make) -> None:
    backend, _ = make(fake_gpus(1), resource_name="example.com/shared-gpu", replicas=2)
    (resource,) = backend.devicehost_discover()
    assert resource.name == "example.com/shared-gpu"
    with pytest.raises(ValueError, match=r"does not serve 'nvidia\.com/gpu'"):
        backend.devicehost_allocate(RESOURCE, (resource.devices[0].id,))


def test_release_scrubs_whole_gpus_through_nvml(make: Make) -> None:
    backend, nvml = make()
    device_ids = ids(backend)
    backend.devicehost_release(RESOURCE, tuple(device_ids))
    assert nvml.scrubbed == [nvml.gpus()[0].uuid, nvml.gpus()[1].uuid]


def test_release_leaves_time_sliced_gpus_alone(make: Make) -> None:
    backend, nvml = make(replicas=2)
    backend.devicehost_release(RESOURCE, tuple(ids(backend)[:1]))
    assert nvml.scrubbed == []


def test_release_of_a_lost_gpu_raises(make: Make) -> None:
    backend, nvml = make()
    nvml.set_lost(nvml.gpus()[0].uuid)
    with pytest.raises(Exception, match="lost"):
        backend.devicehost_release(RESOURCE, tuple(ids(backend)[:1]))
