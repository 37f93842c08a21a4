"""devicehost-example: fake widgets, the backend to read before writing your own.

Every hook a backend can implement is here, each in a few lines. The host calls them from
worker threads, so the little state kept (the settings, the notifiers) is guarded by a lock.
With ``cdi: true`` it also shows how a backend publishes CDI specs (see ``devicehost.cdi``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, StrictBool, field_validator

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Mount, Resource, cdi

log = logging.getLogger(__name__)

DEFAULT_RESOURCES = {"example.com/widget": 4}
ENV_RESOURCES = "DEVICEHOST_EXAMPLE_RESOURCES"


def _resources_from_env(text: str) -> dict[str, int]:
    """Parse ``name=count,name=count``."""
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {name.strip(): int(count) for name, _, count in pairs}


def _widget_ids(resource: str, count: int) -> list[str]:
    """``<short name>-<n>``; a name without a domain (which the host refuses, naming the rule)
    must not make discovery raise and take every other resource down with it."""
    return [f"{resource.rpartition('/')[2]}-{n}" for n in range(count)]


def _cdi_spec(resource: str, count: int) -> cdi.Spec:
    """The resource name is the CDI kind; each widget is a device node, the mount is shared."""
    return cdi.Spec(
        kind=resource,
        devices=[
            cdi.Device(
                i, cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(path=f"/dev/{i}", host_path="/dev/null")])
            )
            for i in _widget_ids(resource, count)
        ],
        edits=cdi.ContainerEdits(
            mounts=[cdi.Mount(host_path="/etc", container_path="/etc/example", options=("bind", "ro"))]
        ),
    )


class ExampleSettings(BaseModel):
    """``backends.example`` in the host config; the host checks it before ``devicehost_configure``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resources: dict[str, NonNegativeInt] | None = Field(
        None, description="resource name -> widget count; unset: $DEVICEHOST_EXAMPLE_RESOURCES or 4 widgets"
    )
    numa_nodes: PositiveInt = Field(1, description="widgets are spread over this many NUMA nodes")
    cdi: StrictBool = Field(False, description="publish a CDI spec and allocate by CDI name")
    cdi_dir: str | None = Field(None, description="absolute dir for the CDI specs; unset: the host's cdi_dir")

    @field_validator("cdi_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value


class ExampleBackend:
    """Offers ``count`` widgets per configured resource; IDs are ``<short name>-<n>``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resources: dict[str, int] = dict(DEFAULT_RESOURCES)
        self._numa_nodes = 1
        self._cdi_dir: Path | None = None  # None: the host's cdi_dir
        self._host_cdi_dir: Path | None = None  # what the host told (devicehost_host_facts)
        self._use_cdi = False
        self._notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self._specs: dict[str, tuple[Path, frozenset[str]]] = {}
        """Started resources' CDI specs on disk: where each was written and the IDs it defines."""
        self.scrubbed: list[tuple[str, tuple[str, ...]]] = []  # what devicehost_release scrubbed

    @devicehost.hookimpl
    def devicehost_settings_model(self) -> type[ExampleSettings]:
        return ExampleSettings

    @devicehost.hookimpl
    def devicehost_configure(self, settings: ExampleSettings | Mapping[str, Any]) -> None:
        """The host hands over a checked :class:`ExampleSettings`; a bare mapping is checked here."""
        if not isinstance(settings, ExampleSettings):
            settings = ExampleSettings.model_validate(settings)  # a ValidationError is a ValueError
        env = os.environ.get(ENV_RESOURCES)
        resources = settings.resources or (_resources_from_env(env) if env else DEFAULT_RESOURCES)
        with self._lock:
            self._resources = dict(resources)
            self._numa_nodes = settings.numa_nodes
            self._use_cdi = settings.cdi
            self._cdi_dir = Path(settings.cdi_dir) if settings.cdi_dir else None
            # A reload keeps started resources served and updates their devices in place, after
            # this hook and before the discovery that reports the new widgets: specs follow now.
            for resource in self._notifiers:
                self._sync_spec(resource)

    @devicehost.hookimpl
    def devicehost_host_facts(self, facts: devicehost.HostFacts) -> None:
        """The host's ``cdi_dir`` (told again when a reload changes it: specs follow now)."""
        with self._lock:
            self._host_cdi_dir = facts.cdi_dir
            for resource in self._notifiers:
                self._sync_spec(resource)

    def _sync_spec(self, resource: str) -> None:
        """Make ``resource``'s CDI spec on disk define exactly its widgets now (call holding the lock).

        The new spec replaces the old one atomically before a spec in a directory the settings
        no longer name is removed, so a name handed out before stays defined.
        """
        count = self._resources.get(resource, 0)
        written = self._specs.pop(resource, None)
        if self._use_cdi and count:  # a CDI spec needs at least one device
            path = cdi.write_spec(_cdi_spec(resource, count), self._cdi_dir or self._host_cdi_dir)
            self._specs[resource] = (path.parent, frozenset(_widget_ids(resource, count)))
            if written is not None and written[0] != path.parent:
                cdi.remove_spec(resource, written[0])
        elif written is not None:
            cdi.remove_spec(resource, written[0])

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
            self._sync_spec(resource)

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        with self._lock:
            self._notifiers.pop(resource, None)
            written = self._specs.pop(resource, None)
            if written is not None:  # where it was written, even if the settings moved since
                cdi.remove_spec(resource, written[0])

    @devicehost.hookimpl
    def devicehost_conformance_set_health(
        self, resource: str, device_id: str, health: devicehost.Health
    ) -> None:
        """A widget fault (or its repair), pushed the way a driver event would be: via the notifier."""
        with self._lock:
            notifier = self._notifiers[resource]
        notifier.set_health({device_id: health})

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        short = resource.rpartition("/")[2]
        envs = {f"EXAMPLE_{short.upper().replace('-', '_').replace('.', '_')}S": ",".join(device_ids)}
        with self._lock:
            unknown = set(device_ids) - set(_widget_ids(resource, self._resources.get(resource, 0)))
            written = self._specs.get(resource)
        if unknown:  # the host checks too, but a backend must not trust its callers
            raise ValueError(f"{resource} has no widgets {sorted(unknown)}")
        if written is not None and written[1].issuperset(device_ids):
            # Only names the spec on disk defines: the runtime adds the device nodes and the mount.
            return ContainerAllocation(
                envs=envs, cdi_devices=[cdi.qualified_name(resource, i) for i in device_ids]
            )
        return ContainerAllocation(
            envs=envs,
            mounts=[Mount(container_path="/etc/example", host_path="/etc", read_only=True)],
            devices=[
                DeviceSpec(container_path=f"/dev/{device_id}", host_path="/dev/null")
                for device_id in device_ids
            ],
        )

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        """No container holds these widgets any more: scrub them before the next tenant."""
        with self._lock:
            self.scrubbed.append((resource, device_ids))
        log.info("scrubbed %s widgets %s", resource, ", ".join(device_ids))
