"""The devicehost hooks: NVIDIA GPUs as one extended resource, one device per GPU or replica.

The host calls the hooks from worker threads. The lock guards the settings, the NVML seam, the
last discovery and the started resources; NVML calls that may take a while (event-set setup,
health checks) run outside it, and the health watchers' callbacks never take it.
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
from devicehost_nvidia.fake import FakeGpu, FakeNvml
from devicehost_nvidia.health import HealthCallback, HealthWatcher
from devicehost_nvidia.inventory import Inventory, discover, log_gpus
from devicehost_nvidia.nvml import Nvml, NvmlError, NvmlUnavailable, PynvmlNvml

_log = structlog.get_logger(__name__)


def _nvml_from_settings(settings: Settings) -> Nvml:
    if settings.nvml == "fake":
        return FakeNvml(FakeGpu(**gpu.model_dump()) for gpu in settings.fake_gpus)
    return PynvmlNvml()


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
        self._injected = nvml
        self._clock = clock
        self._health_wait_ms = health_wait_ms
        self._settings = Settings()
        self._nvml: Nvml = nvml or _nvml_from_settings(self._settings)
        self._initialized = False
        self._unavailable_logged = False
        self._inventory: Inventory | None = None
        self._watchers: dict[str, HealthWatcher] = {}
        self._notifiers: dict[str, ResourceNotifier] = {}

    @hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        parsed = parse_settings(settings)
        with self._lock:
            source_changed = (parsed.nvml, parsed.fake_gpus) != (
                self._settings.nvml,
                self._settings.fake_gpus,
            )
            layout_changed = (parsed.device_id_strategy, parsed.replicas) != (
                self._settings.device_id_strategy,
                self._settings.replicas,
            )
            if self._injected is None and source_changed:
                self._nvml = _nvml_from_settings(parsed)
                self._initialized = False
                self._inventory = None
            if layout_changed:
                self._inventory = None
            self._settings = parsed

    @hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            inventory = self._refresh()
            if inventory is None:
                return []
            resource = self._settings.resource_name
            watcher = self._watchers.get(resource)
        if watcher is not None and watcher.uuids != {gpu.uuid for gpu in inventory.gpus}:
            watcher = self._restart_watcher(resource, watcher)
        health = watcher.current() if watcher is not None else {}
        devices = tuple(
            Device(
                device_id,
                health.get(gpu.uuid, Health.HEALTHY),
                () if gpu.numa_node is None else (gpu.numa_node,),
            )
            for device_id, gpu in inventory.gpu_of.items()
        )
        return [Resource(resource, devices)]

    def _refresh(self) -> Inventory | None:
        """Discover the GPUs again (lock held); on an NVML error keep what was found before."""
        if not self._ensure_nvml():
            return None
        settings, previous = self._settings, self._inventory
        inventory: Inventory | None
        try:
            inventory = discover(
                self._nvml,
                sysfs_root=settings.sysfs_root,
                strategy=settings.device_id_strategy,
                replicas=settings.replicas,
            )
            if previous is None or previous.gpus != inventory.gpus:
                log_gpus(inventory, self._nvml.driver_version())
        except NvmlError as error:
            _log.error("nvidia_discovery_failed", detail=str(error), keeping_previous=previous is not None)
            inventory = previous
        self._inventory = inventory
        return inventory

    @hookimpl
    def devicehost_start(self, resource: str, notifier: ResourceNotifier) -> None:
        with self._lock:
            inventory = self._inventory or self._refresh()
            if resource != self._settings.resource_name or inventory is None:
                return
            self._notifiers[resource] = notifier
            if not self._settings.health_checks or resource in self._watchers:
                return
            watcher = self._new_watcher(resource, inventory, None)
            self._watchers[resource] = watcher
        watcher.start()

    @hookimpl
    def devicehost_stop(self, resource: str) -> None:
        with self._lock:
            watcher = self._watchers.pop(resource, None)
            self._notifiers.pop(resource, None)
        if watcher is not None:
            watcher.stop()

    @hookimpl
    def devicehost_health(self, resource: str, devices: tuple[Device, ...]) -> Mapping[str, Health] | None:
        with self._lock:
            watcher, inventory = self._watchers.get(resource), self._inventory
        if watcher is None or inventory is None:
            return None
        health = watcher.health()
        return {
            device.id: health[inventory.gpu_of[device.id].uuid]
            for device in devices
            if device.id in inventory.gpu_of and inventory.gpu_of[device.id].uuid in health
        }

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

    def _checked(self, resource: str, device_ids: Sequence[str]) -> tuple[Inventory, Settings]:
        """The inventory and settings, once every ID is known; ValueError naming the others."""
        inventory = self._inventory or self._refresh()
        if resource != self._settings.resource_name or inventory is None:
            raise ValueError(f"the nvidia backend does not serve {resource!r}")
        unknown = sorted({i for i in device_ids if i not in inventory.gpu_of})
        if unknown:
            raise ValueError(f"unknown {resource} device IDs: {', '.join(unknown)}")
        return inventory, self._settings

    def _ensure_nvml(self) -> bool:
        """Initialise NVML once; without it, log one line (until it comes back) and say False."""
        if self._initialized:
            return True
        try:
            self._nvml.init()
        except NvmlError as error:
            if not self._unavailable_logged:
                event = "nvml_unavailable" if isinstance(error, NvmlUnavailable) else "nvml_init_failed"
                _log.warning(event, detail=str(error), consequence="offering no NVIDIA GPUs until it loads")
                self._unavailable_logged = True
            return False
        if self._unavailable_logged:
            _log.info("nvml_available")
        self._initialized, self._unavailable_logged = True, False
        return True

    def _new_watcher(
        self, resource: str, inventory: Inventory, initial: Mapping[str, Health] | None
    ) -> HealthWatcher:
        return HealthWatcher(
            self._nvml,
            [gpu.uuid for gpu in inventory.gpus],
            ignored_xids=self._settings.ignored_xids,
            recovery_interval=self._settings.recovery_check_interval,
            on_change=self._pusher(resource, inventory),
            clock=self._clock,
            wait_ms=self._health_wait_ms,
            initial=initial,
        )

    def _restart_watcher(self, resource: str, old: HealthWatcher) -> HealthWatcher:
        """The GPUs changed: watch the new set, keeping what is known about the GPUs that stayed."""
        old.stop()
        with self._lock:
            if self._watchers.get(resource) is not old or self._inventory is None:
                return old
            new = self._new_watcher(resource, self._inventory, old.current())
            self._watchers[resource] = new
        new.start()
        return new

    def _pusher(self, resource: str, inventory: Inventory) -> HealthCallback:
        """Turn per-GPU health changes into per-device ones for the resource's notifier."""

        def push(changes: Mapping[str, Health]) -> None:
            notifier = self._notifiers.get(resource)
            if notifier is not None:
                notifier.set_health(
                    {
                        device_id: changes[gpu.uuid]
                        for device_id, gpu in inventory.gpu_of.items()
                        if gpu.uuid in changes
                    }
                )

        return push
