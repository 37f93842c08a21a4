"""devicehost-gizmo: the smallest out-of-tree backend, with health set from its settings."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import devicehost
from devicehost import ContainerAllocation, Device, Health, Resource

RESOURCE = "gizmos.example.org/gizmo"


class GizmoBackend:
    """``count`` gizmos; those named in ``unhealthy`` are reported Unhealthy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 2
        self._unhealthy: frozenset[str] = frozenset()

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        count = settings.get("count", 2)
        unhealthy = settings.get("unhealthy", [])
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"settings.count must be an integer >= 0, not {count!r}")
        if not isinstance(unhealthy, list) or not all(isinstance(i, str) for i in unhealthy):
            raise ValueError(f"settings.unhealthy must be a list of device IDs, not {unhealthy!r}")
        with self._lock:
            self._count = count
            self._unhealthy = frozenset(unhealthy)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            ids = [f"gizmo-{n}" for n in range(self._count)]
            health = {i: Health.UNHEALTHY if i in self._unhealthy else Health.HEALTHY for i in ids}
        return [Resource(RESOURCE, tuple(Device(i, health=health[i]) for i in ids))]

    @devicehost.hookimpl
    def devicehost_health(self, resource: str, devices: tuple[Device, ...]) -> dict[str, Health]:
        with self._lock:
            unhealthy = self._unhealthy
        return {d.id: Health.UNHEALTHY if d.id in unhealthy else Health.HEALTHY for d in devices}

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"GIZMOS": ",".join(device_ids)})
