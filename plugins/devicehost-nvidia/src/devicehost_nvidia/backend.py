"""The devicehost hooks: NVIDIA GPUs as one extended resource, one device per GPU or replica.

The host calls the hooks from worker threads. The lock guards the settings and the GPU
discovery (the NVML seam and the last inventory); the resources' health watchers and notifiers
live in a ResourceHealth with its own lock, and NVML calls that may take a while (event-set
setup, health checks) run outside the backend's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from devicehost import (
    ContainerAllocation,
    Device,
    Health,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
    hookimpl,
)
from devicehost_nvidia import topology
from devicehost_nvidia.allocation import container_allocation
from devicehost_nvidia.config import Settings, parse_settings
from devicehost_nvidia.discovery import GpuDiscovery
from devicehost_nvidia.inventory import Inventory
from devicehost_nvidia.nvml import Nvml
from devicehost_nvidia.resource_health import ResourceHealth

_log = structlog.get_logger(__name__)


class NvidiaBackend:
    """The ``nvidia`` backend. The host builds it with no arguments (real NVML).

    :param nvml: use this NVML instead of the one the settings pick (tests: a FakeNvml).
    :param clock: monotonic seconds, for the recovery interval.
    :param health_wait_ms: how long the event thread waits for an event before re-checking.
    """

    def __init__(
        self,
        nvml: Nvml | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        health_wait_ms: int = 1000,
    ) -> None:
        self._lock = threading.Lock()
        self._settings = Settings()
        self._discovery = GpuDiscovery(nvml, self._settings)
        self._health = ResourceHealth(clock=clock, wait_ms=health_wait_ms)

    @hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        parsed = parse_settings(settings)
        with self._lock:
            self._discovery.configure(self._settings, parsed)
            self._settings = parsed

    @hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            settings, inventory = self._settings, self._discovery.refresh(self._settings)
            nvml = self._discovery.nvml
        if inventory is None:
            return []
        health = self._health.known(settings.resource_name, nvml, inventory, settings)
        devices = tuple(
            Device(
                device_id,
                health.get(gpu.uuid, Health.HEALTHY),
                () if gpu.numa_node is None else (gpu.numa_node,),
            )
            for device_id, gpu in inventory.gpu_of.items()
        )
        return [Resource(settings.resource_name, devices)]

    @hookimpl
    def devicehost_start(self, resource: str, notifier: ResourceNotifier) -> None:
        with self._lock:
            settings, inventory = self._settings, self._discovery.current(self._settings)
            nvml = self._discovery.nvml
        if resource == settings.resource_name and inventory is not None:
            self._health.start(resource, notifier, nvml, inventory, settings)

    @hookimpl
    def devicehost_stop(self, resource: str) -> None:
        self._health.stop(resource)

    @hookimpl
    def devicehost_health(self, resource: str, devices: tuple[Device, ...]) -> Mapping[str, Health] | None:
        with self._lock:
            inventory = self._discovery.inventory
        if inventory is None:
            return None
        return self._health.check(resource, inventory, devices)

    @hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        with self._lock:
            inventory, settings = self._checked(resource, device_ids)
        gpus = list({inventory.gpu_of[i].uuid: inventory.gpu_of[i] for i in device_ids}.values())
        return container_allocation(
            gpus, cdi_kind=settings.cdi_kind if settings.cdi else None, device_specs=settings.device_specs
        )

    @hookimpl
    def devicehost_preferred_allocation(
        self, resource: str, request: PreferredAllocationRequest
    ) -> list[str]:
        with self._lock:
            inventory, _ = self._checked(resource, (*request.available, *request.must_include))
        return topology.preferred(
            request.available, request.must_include, request.size, inventory.gpu_of, inventory.nvlinked
        )

    @hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        """Scrub whole GPUs no container holds; replicas share their GPU with others, so not those."""
        with self._lock:
            inventory, settings = self._checked(resource, device_ids)
            nvml = self._discovery.nvml
        if settings.replicas > 1:
            _log.info("release_skipped", reason="time-sliced GPUs are shared", devices=list(device_ids))
            return
        for uuid in dict.fromkeys(inventory.gpu_of[i].uuid for i in device_ids):
            nvml.scrub(uuid)
            _log.info("gpu_scrubbed", uuid=uuid)

    def _checked(self, resource: str, device_ids: Sequence[str]) -> tuple[Inventory, Settings]:
        """The inventory and settings (lock held), once every ID is known; ValueError naming the others."""
        inventory = self._discovery.current(self._settings)
        if resource != self._settings.resource_name or inventory is None:
            raise ValueError(f"the nvidia backend does not serve {resource!r}")
        unknown = sorted({i for i in device_ids if i not in inventory.gpu_of})
        if unknown:
            raise ValueError(f"unknown {resource} device IDs: {', '.join(unknown)}")
        return inventory, self._settings
