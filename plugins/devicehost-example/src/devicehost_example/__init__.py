"""devicehost-example: fake widgets, the backend to read before writing your own.

Every hook a backend can implement is here, each in a few lines. The host calls them from
worker threads, so the little state kept (the settings, the notifiers) is guarded by a lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Mount, Resource

DEFAULT_RESOURCES = {"example.com/widget": 4}
ENV_RESOURCES = "DEVICEHOST_EXAMPLE_RESOURCES"


def _resources_from_env(text: str) -> dict[str, int]:
    """Parse ``name=count,name=count``."""
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {name.strip(): int(count) for name, _, count in pairs}


class ExampleBackend:
    """Offers ``count`` widgets per configured resource; IDs are ``<short name>-<n>``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resources: dict[str, int] = dict(DEFAULT_RESOURCES)
        self._numa_nodes = 1
        self._notifiers: dict[str, devicehost.ResourceNotifier] = {}

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        env = os.environ.get(ENV_RESOURCES)
        resources = settings.get("resources") or (_resources_from_env(env) if env else DEFAULT_RESOURCES)
        numa_nodes = settings.get("numa_nodes", 1)
        if not isinstance(resources, Mapping) or not all(
            isinstance(count, int) and count >= 0 for count in resources.values()
        ):
            raise ValueError("settings.resources must map resource names to device counts >= 0")
        if not isinstance(numa_nodes, int) or numa_nodes < 1:
            raise ValueError("settings.numa_nodes must be an integer >= 1")
        with self._lock:
            self._resources = dict(resources)
            self._numa_nodes = numa_nodes

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            return [
                Resource(
                    name,
                    tuple(
                        Device(f"{name.split('/')[1]}-{n}", numa_nodes=(n % self._numa_nodes,))
                        for n in range(count)
                    ),
                )
                for name, count in self._resources.items()
            ]

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        with self._lock:
            self._notifiers[resource] = notifier

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        with self._lock:
            self._notifiers.pop(resource, None)

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        short = resource.split("/")[1]
        return ContainerAllocation(
            envs={f"EXAMPLE_{short.upper().replace('-', '_').replace('.', '_')}S": ",".join(device_ids)},
            mounts=[Mount("/etc/example", "/etc", read_only=True)],
            devices=[DeviceSpec(f"/dev/{device_id}", "/dev/null", "rw") for device_id in device_ids],
        )
