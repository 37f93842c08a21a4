"""Health per served resource: a GPU health watcher and a notifier each, GPU health as device health.

The lock guards the watchers and notifiers only. Watcher calls that may take a while (start,
stop, health checks) run outside it, and the watchers' callbacks never take it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from devicehost import Device, Health, ResourceNotifier
from devicehost_nvidia.config import Settings
from devicehost_nvidia.health import HealthCallback, HealthWatcher
from devicehost_nvidia.inventory import Inventory
from devicehost_nvidia.nvml import Nvml


class ResourceHealth:
    """The health watcher and notifier of each started resource.

    :param clock: monotonic seconds, for the watchers' recovery interval.
    :param wait_ms: how long a watcher's event thread waits for an event before re-checking.
    """

    def __init__(self, *, clock: Callable[[], float], wait_ms: int) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._wait_ms = wait_ms
        self._watchers: dict[str, HealthWatcher] = {}
        self._notifiers: dict[str, ResourceNotifier] = {}

    def start(
        self, resource: str, notifier: ResourceNotifier, nvml: Nvml, inventory: Inventory, settings: Settings
    ) -> None:
        """Send the resource's health changes to ``notifier``; watch its GPUs unless checks are off."""
        with self._lock:
            self._notifiers[resource] = notifier
            if not settings.health_checks or resource in self._watchers:
                return
            watcher = self._new_watcher(resource, nvml, inventory, settings, None)
            self._watchers[resource] = watcher
        watcher.start()

    def stop(self, resource: str) -> None:
        """Stop watching the resource and forget its notifier; safe to call more than once."""
        with self._lock:
            watcher = self._watchers.pop(resource, None)
            self._notifiers.pop(resource, None)
        if watcher is not None:
            watcher.stop()

    def known(self, resource: str, nvml: Nvml, inventory: Inventory, settings: Settings) -> dict[str, Health]:
        """Each GPU's last known health by UUID, {} when unwatched; the GPUs changed: watch the new set."""
        with self._lock:
            watcher = self._watchers.get(resource)
        if watcher is None:
            return {}
        if watcher.uuids != {gpu.uuid for gpu in inventory.gpus}:
            watcher = self._restart(resource, watcher, nvml, inventory, settings)
        return watcher.current()

    def check(
        self, resource: str, inventory: Inventory, devices: tuple[Device, ...]
    ) -> dict[str, Health] | None:
        """Check the GPUs now: the health of each device whose GPU is watched; None when unwatched."""
        with self._lock:
            watcher = self._watchers.get(resource)
        if watcher is None:
            return None
        health = watcher.health()
        return {
            device.id: health[inventory.gpu_of[device.id].uuid]
            for device in devices
            if device.id in inventory.gpu_of and inventory.gpu_of[device.id].uuid in health
        }

    def _restart(
        self, resource: str, old: HealthWatcher, nvml: Nvml, inventory: Inventory, settings: Settings
    ) -> HealthWatcher:
        """Watch the new set of GPUs, keeping what is known about the GPUs that stayed."""
        old.stop()
        known = old.current()
        with self._lock:
            if self._watchers.get(resource) is not old:
                return old
            new = self._new_watcher(resource, nvml, inventory, settings, known)
            self._watchers[resource] = new
        new.start()
        return new

    def _new_watcher(
        self,
        resource: str,
        nvml: Nvml,
        inventory: Inventory,
        settings: Settings,
        initial: Mapping[str, Health] | None,
    ) -> HealthWatcher:
        return HealthWatcher(
            nvml,
            [gpu.uuid for gpu in inventory.gpus],
            ignored_xids=settings.ignored_xids,
            recovery_interval=settings.recovery_check_interval,
            on_change=self._pusher(resource, inventory),
            clock=self._clock,
            wait_ms=self._wait_ms,
            initial=initial,
        )

    def _pusher(self, resource: str, inventory: Inventory) -> HealthCallback:
        """Turn per-GPU health changes into per-device ones for the resource's notifier (lock-free)."""

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
