"""The dataclasses backends and the host exchange.

Backends build and return these; they never see protobuf messages. The host converts them to
and from the v1beta1 wire messages.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Health(enum.StrEnum):
    """A device's health as the kubelet understands it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Device:
    """One allocatable device of a resource.

    :param id: unique within its resource, at most 63 characters.
    :param health: healthy devices count towards the node's allocatable capacity.
    :param numa_nodes: the NUMA nodes the device is attached to, for topology-aware admission.
    """

    id: str
    health: Health = Health.HEALTHY
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Resource:
    """An extended resource a backend offers, such as ``example.com/widget``.

    :param name: the extended resource name; the kubelet's rules apply
        (see :func:`devicehost.hookspecs.rules.resource_name_problem`).
    :param devices: the devices that make up the resource's capacity.
    """

    name: str
    devices: tuple[Device, ...] = ()


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container.

    :param container_path: absolute path inside the container.
    :param host_path: absolute path on the node.
    :param read_only: mount read-only.
    """

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    """A device node made available in the container.

    :param container_path: absolute path inside the container.
    :param host_path: absolute path of the device node on the node.
    :param permissions: cgroup permissions, any of ``r``, ``w`` and ``m``.
    """

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets for the devices allocated to it.

    :param envs: environment variables to set.
    :param mounts: host paths to mount.
    :param devices: device nodes to expose.
    :param annotations: annotations passed to the container runtime.
    :param cdi_devices: fully qualified CDI device names (``vendor.com/class=name``).
    """

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    devices: Sequence[DeviceSpec] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: Sequence[str] = ()


@dataclass(frozen=True)
class PreferredAllocationRequest:
    """The kubelet's question for one container: which devices would you pick?

    :param available: device IDs the kubelet may choose from.
    :param must_include: device IDs that must be part of the answer.
    :param size: how many device IDs the answer must hold.
    """

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class ResourceNotifier(Protocol):
    """Handed to a backend in ``devicehost_start``: push changes to the host at any time.

    Every method is thread-safe and returns at once; the host applies the change on its own
    loop and pushes it to the kubelet's ListAndWatch stream. Calls after the resource stopped
    are ignored.
    """

    def set_health(self, health: Mapping[str, Health]) -> None:
        """Set the health of the named devices; devices not named keep theirs."""

    def set_devices(self, devices: Sequence[Device]) -> None:
        """Replace the resource's whole device list."""

    def rediscover(self) -> None:
        """Ask the host to run discovery for every backend now (new or removed resources)."""
