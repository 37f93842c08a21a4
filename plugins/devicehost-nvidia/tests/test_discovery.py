"""GpuDiscovery on its own: which NVML, initialising it once, and keeping what was found."""

from __future__ import annotations

from structlog.testing import capture_logs

from devicehost_nvidia.config import Settings, parse_settings
from devicehost_nvidia.discovery import GpuDiscovery, nvml_from_settings
from devicehost_nvidia.fake import FakeNvml, fake_gpus
from devicehost_nvidia.nvml import PynvmlNvml

DEFAULTS = Settings()
FAKE = parse_settings({"nvml": "fake", "fake_gpus": [{"uuid": "GPU-x"}, {"uuid": "GPU-y", "minor": 1}]})


def uuids(discovery: GpuDiscovery, settings: Settings = DEFAULTS) -> list[str]:
    inventory = discovery.refresh(settings)
    assert inventory is not None
    return [gpu.uuid for gpu in inventory.gpus]


def test_settings_pick_the_fake_or_the_real_nvml() -> None:
    fake = nvml_from_settings(FAKE)
    assert isinstance(fake, FakeNvml)
    assert [gpu.uuid for gpu in fake.gpus()] == ["GPU-x", "GPU-y"]
    assert isinstance(nvml_from_settings(DEFAULTS), PynvmlNvml)


def test_a_new_nvml_source_replaces_the_nvml_and_voids_the_inventory() -> None:
    discovery = GpuDiscovery(None, FAKE)
    assert uuids(discovery, FAKE) == ["GPU-x", "GPU-y"]
    other = parse_settings({"nvml": "fake", "fake_gpus": [{"uuid": "GPU-z"}]})
    discovery.configure(FAKE, other)
    assert discovery.inventory is None
    assert uuids(discovery, other) == ["GPU-z"]


def test_an_injected_nvml_stays_whatever_the_settings_say() -> None:
    nvml = FakeNvml(fake_gpus(1))
    discovery = GpuDiscovery(nvml, DEFAULTS)
    discovery.refresh(DEFAULTS)
    discovery.configure(DEFAULTS, FAKE)
    assert discovery.nvml is nvml
    assert discovery.inventory is not None


def test_a_layout_change_voids_the_inventory() -> None:
    discovery = GpuDiscovery(FakeNvml(fake_gpus(1)), DEFAULTS)
    discovery.refresh(DEFAULTS)
    replicated = parse_settings({"replicas": 2})
    discovery.configure(DEFAULTS, replicated)
    assert discovery.inventory is None
    inventory = discovery.current(replicated)
    assert inventory is not None
    assert len(inventory.gpu_of) == 2


def test_current_reuses_the_last_inventory_and_refresh_does_not() -> None:
    nvml = FakeNvml(fake_gpus(2))
    discovery = GpuDiscovery(nvml, DEFAULTS)
    first = discovery.current(DEFAULTS)
    nvml.remove_gpu(nvml.gpus()[1].uuid)
    assert discovery.current(DEFAULTS) is first
    assert len(uuids(discovery)) == 1


def test_gpus_are_logged_when_they_change_only() -> None:
    nvml = FakeNvml(fake_gpus(2))
    discovery = GpuDiscovery(nvml, DEFAULTS)
    with capture_logs() as logs:
        discovery.refresh(DEFAULTS)
        discovery.refresh(DEFAULTS)
        nvml.remove_gpu(nvml.gpus()[1].uuid)
        discovery.refresh(DEFAULTS)
    assert [log["event"] for log in logs] == ["nvidia_gpu"] * 3


def test_an_nvml_error_keeps_the_previous_inventory() -> None:
    nvml = FakeNvml(fake_gpus(2))
    discovery = GpuDiscovery(nvml, DEFAULTS)
    before = discovery.refresh(DEFAULTS)
    nvml.set_broken()
    assert discovery.refresh(DEFAULTS) is before


def test_without_nvml_nothing_is_found_and_one_line_is_logged_until_it_loads() -> None:
    nvml = FakeNvml(fake_gpus(1), available=False)
    discovery = GpuDiscovery(nvml, DEFAULTS)
    with capture_logs() as logs:
        assert discovery.refresh(DEFAULTS) is None
        assert discovery.refresh(DEFAULTS) is None
        nvml.set_available(True)
        assert len(uuids(discovery)) == 1
    assert [log["event"] for log in logs] == ["nvml_unavailable", "nvml_available", "nvidia_gpu"]
