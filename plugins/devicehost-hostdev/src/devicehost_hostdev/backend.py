"""The hook class the ``hostdev`` entry point names.

The only state is the validated settings, swapped whole under a lock on every reload. Every
hook that needs devices scans the tree afresh, so hot-plug needs no watcher: discovery,
health and allocation all see the tree as it is when they run.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, Mount, Resource
from devicehost_hostdev.config import Settings, parse_settings
from devicehost_hostdev.scan import FoundDevice, Node, Tree, scan_resource


def _health(device: FoundDevice | None) -> Health:
    return Health.HEALTHY if device is not None and not device.missing else Health.UNHEALTHY


class HostdevBackend:
    """Offers host device nodes, files and USB devices as configured under ``backends.hostdev``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings = Settings()

    def _scan(self, resource: str) -> dict[str, FoundDevice]:
        """The resource's devices now; none when it is not (or no longer) configured."""
        with self._lock:
            settings = self._settings
        config = settings.resource(resource)
        return scan_resource(Tree(settings.root), config) if config else {}

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        parsed = parse_settings(settings)
        with self._lock:
            self._settings = parsed

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            settings = self._settings
        tree = Tree(settings.root)
        resources = []
        for resource in settings.resources:
            found = scan_resource(tree, resource).values()
            resources.append(Resource(resource.name, tuple(Device(d.id, _health(d)) for d in found)))
        return resources

    @devicehost.hookimpl
    def devicehost_health(self, resource: str, devices: tuple[Device, ...]) -> dict[str, Health]:
        found = self._scan(resource)
        return {device.id: _health(found.get(device.id)) for device in devices}

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        found = self._scan(resource)
        unknown = [device_id for device_id in device_ids if device_id not in found]
        if unknown:
            raise ValueError(f"{resource}: no device with ID {', '.join(unknown)} is present now")
        by_container_path: dict[str, Node] = {}
        for device_id in device_ids:
            device = found[device_id]
            if device.missing:
                raise ValueError(f"{resource}: device {device_id} is missing {', '.join(device.missing)}")
            for node in device.nodes:
                taken = by_container_path.setdefault(node.container_path, node)
                if taken != node:
                    raise ValueError(
                        f"{resource}: {taken.host_path} and {node.host_path} "
                        f"both go to {node.container_path} in the container"
                    )
        nodes = by_container_path.values()
        return ContainerAllocation(
            mounts=[
                Mount(container_path=n.container_path, host_path=n.host_path, read_only=n.read_only)
                for n in nodes
                if n.mount
            ],
            devices=[
                DeviceSpec(container_path=n.container_path, host_path=n.host_path, permissions=n.permissions)
                for n in nodes
                if not n.mount
            ],
        )
