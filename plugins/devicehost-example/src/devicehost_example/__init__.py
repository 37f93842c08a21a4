"""devicehost-example: fake widgets, the backend to read before writing your own.

Every hook a backend can implement is here, each in a few lines. The host calls them from
worker threads, so the little state kept (the settings, the notifiers) is guarded by a lock.
With ``cdi: true`` it also shows how a backend publishes CDI specs (see ``devicehost.cdi``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Mount, Resource, cdi

DEFAULT_RESOURCES = {"example.com/widget": 4}
ENV_RESOURCES = "DEVICEHOST_EXAMPLE_RESOURCES"


def _resources_from_env(text: str) -> dict[str, int]:
    """Parse ``name=count,name=count``."""
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {name.strip(): int(count) for name, _, count in pairs}


def _widget_ids(resource: str, count: int) -> list[str]:
    return [f"{resource.split('/')[1]}-{n}" for n in range(count)]


def _cdi_spec(resource: str, count: int) -> cdi.Spec:
    """The resource name is the CDI kind; each widget is a device node, the mount is shared."""
    return cdi.Spec(
        kind=resource,
        devices=[
            cdi.Device(i, cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(f"/dev/{i}", "/dev/null")]))
            for i in _widget_ids(resource, count)
        ],
        edits=cdi.ContainerEdits(mounts=[cdi.Mount("/etc", "/etc/example", ("bind", "ro"))]),
    )


class ExampleBackend:
    """Offers ``count`` widgets per configured resource; IDs are ``<short name>-<n>``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resources: dict[str, int] = dict(DEFAULT_RESOURCES)
        self._numa_nodes = 1
        self._cdi_dir: Path | None = None  # None: the host's cdi_dir
        self._use_cdi = False
        self._notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self._spec_dirs: dict[str, Path] = {}  # resource -> where its CDI spec was written

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        env = os.environ.get(ENV_RESOURCES)
        resources = settings.get("resources") or (_resources_from_env(env) if env else DEFAULT_RESOURCES)
        numa_nodes = settings.get("numa_nodes", 1)
        use_cdi = settings.get("cdi", False)
        cdi_dir = settings.get("cdi_dir")
        if not isinstance(resources, Mapping) or not all(
            isinstance(count, int) and count >= 0 for count in resources.values()
        ):
            raise ValueError("settings.resources must map resource names to device counts >= 0")
        if not isinstance(numa_nodes, int) or numa_nodes < 1:
            raise ValueError("settings.numa_nodes must be an integer >= 1")
        if not isinstance(use_cdi, bool):
            raise ValueError("settings.cdi must be true or false")
        if cdi_dir is not None and not (isinstance(cdi_dir, str) and cdi_dir.startswith("/")):
            raise ValueError("settings.cdi_dir must be an absolute path")
        with self._lock:
            self._resources = dict(resources)
            self._numa_nodes = numa_nodes
            self._use_cdi = use_cdi
            self._cdi_dir = Path(cdi_dir) if cdi_dir else None

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            return [
                Resource(
                    name,
                    tuple(
                        Device(device_id, numa_nodes=(n % self._numa_nodes,))
                        for n, device_id in enumerate(_widget_ids(name, count))
                    ),
                )
                for name, count in self._resources.items()
            ]

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        with self._lock:
            self._notifiers[resource] = notifier
            count = self._resources.get(resource, 0)
            if self._use_cdi and count:  # a CDI spec needs at least one device
                path = cdi.write_spec(_cdi_spec(resource, count), self._cdi_dir)
                self._spec_dirs[resource] = path.parent

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        with self._lock:
            self._notifiers.pop(resource, None)
            spec_dir = self._spec_dirs.pop(resource, None)
            if spec_dir is not None:  # where it was written, even if the settings moved since
                cdi.remove_spec(resource, spec_dir)

    def conformance_set_health(self, resource: str, device_id: str, health: devicehost.Health) -> None:
        """A widget fault (or its repair), pushed the way a driver event would be: via the notifier."""
        with self._lock:
            notifier = self._notifiers[resource]
        notifier.set_health({device_id: health})

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        short = resource.split("/")[1]
        envs = {f"EXAMPLE_{short.upper().replace('-', '_').replace('.', '_')}S": ",".join(device_ids)}
        with self._lock:
            unknown = set(device_ids) - set(_widget_ids(resource, self._resources.get(resource, 0)))
            spec_written = resource in self._spec_dirs
        if unknown:  # the host checks too, but a backend must not trust its callers
            raise ValueError(f"{resource} has no widgets {sorted(unknown)}")
        if spec_written:  # the runtime adds the device nodes and the mount from the spec
            return ContainerAllocation(
                envs=envs, cdi_devices=[cdi.qualified_name(resource, i) for i in device_ids]
            )
        return ContainerAllocation(
            envs=envs,
            mounts=[Mount("/etc/example", "/etc", read_only=True)],
            devices=[DeviceSpec(f"/dev/{device_id}", "/dev/null", "rw") for device_id in device_ids],
        )
