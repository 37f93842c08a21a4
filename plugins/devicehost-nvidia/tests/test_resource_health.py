"""ResourceHealth on its own: one watcher and notifier per resource, GPU health as device health."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import pytest

from devicehost import Device, Health
from devicehost_nvidia.config import Settings, parse_settings
from devicehost_nvidia.fake import FakeNvml, fake_gpus
from devicehost_nvidia.inventory import Inventory, discover
from devicehost_nvidia.nvml import EventKind
from devicehost_nvidia.resource_health import ResourceHealth

RESOURCE = "nvidia.com/gpu"
REPLICATED = parse_settings({"replicas": 2})


class Notifier:
    """Records set_health calls; a test can wait for the next one."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Health]] = []
        self._called = threading.Event()

    def set_health(self, health: Mapping[str, Health]) -> None:
        self.calls.append(dict(health))
        self._called.set()

    def set_devices(self, devices: Sequence[Device]) -> None:
        raise AssertionError("never replaces the device list")

    def rediscover(self) -> None:
        raise AssertionError("never asks for rediscovery")

    def wait(self) -> bool:
        return self._called.wait(5.0)


def inventory_of(nvml: FakeNvml, settings: Settings = REPLICATED) -> Inventory:
    return discover(nvml, sysfs_root="/nonexistent", strategy="uuid", replicas=settings.replicas)


@pytest.fixture
def health() -> Iterator[ResourceHealth]:
    tracker = ResourceHealth(clock=lambda: 0.0, wait_ms=20)
    yield tracker
    tracker.stop(RESOURCE)


def test_gpu_changes_reach_the_notifier_as_device_changes(health: ResourceHealth) -> None:
    nvml = FakeNvml(fake_gpus(2))
    notifier = Notifier()
    health.start(RESOURCE, notifier, nvml, inventory_of(nvml), REPLICATED)
    bad = nvml.gpus()[1].uuid
    nvml.inject(bad, EventKind.XID, 79)
    assert notifier.wait()
    assert notifier.calls == [{f"{bad}::0": Health.UNHEALTHY, f"{bad}::1": Health.UNHEALTHY}]


def test_start_twice_watches_once_and_stop_frees_the_event_set(health: ResourceHealth) -> None:
    nvml = FakeNvml(fake_gpus(1))
    inventory = inventory_of(nvml)
    health.start(RESOURCE, Notifier(), nvml, inventory, REPLICATED)
    health.start(RESOURCE, Notifier(), nvml, inventory, REPLICATED)
    assert nvml.open_event_sets == 1
    health.stop(RESOURCE)
    health.stop(RESOURCE)
    assert nvml.open_event_sets == 0
    assert health.known(RESOURCE, nvml, inventory, REPLICATED) == {}


def test_without_health_checks_nothing_is_watched(health: ResourceHealth) -> None:
    nvml = FakeNvml(fake_gpus(1))
    inventory = inventory_of(nvml)
    health.start(RESOURCE, Notifier(), nvml, inventory, parse_settings({"health_checks": False}))
    assert nvml.open_event_sets == 0
    assert health.check(RESOURCE, inventory, ()) is None
    assert health.known(RESOURCE, nvml, inventory, REPLICATED) == {}


def test_check_answers_for_the_devices_of_watched_gpus_only(health: ResourceHealth) -> None:
    nvml = FakeNvml(fake_gpus(2))
    inventory = inventory_of(nvml)
    health.start(RESOURCE, Notifier(), nvml, inventory, REPLICATED)
    lost = nvml.gpus()[0].uuid
    nvml.set_lost(lost)
    devices = (Device(f"{lost}::1"), Device("GPU-unknown::0"))
    assert health.check(RESOURCE, inventory, devices) == {f"{lost}::1": Health.UNHEALTHY}


def test_changed_gpus_get_a_new_watcher_that_keeps_known_health(health: ResourceHealth) -> None:
    nvml = FakeNvml(fake_gpus(3))
    notifier = Notifier()
    health.start(RESOURCE, notifier, nvml, inventory_of(nvml), REPLICATED)
    first, _, third = (gpu.uuid for gpu in nvml.gpus())
    nvml.inject(first, EventKind.DOUBLE_BIT_ECC)
    assert notifier.wait()
    nvml.remove_gpu(third)
    smaller = inventory_of(nvml)
    known = health.known(RESOURCE, nvml, smaller, REPLICATED)
    assert known == {first: Health.UNHEALTHY, nvml.gpus()[1].uuid: Health.HEALTHY}
    assert nvml.open_event_sets == 1
    assert health.known(RESOURCE, nvml, smaller, REPLICATED) == known
