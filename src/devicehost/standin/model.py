"""What the kubelet stand-in reports: events, device lists, resource, allocation and DRA views."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.proto.dra.v1 import api_pb2 as dra_pb2

HEALTHY = "Healthy"
VERSION = "v1beta1"
"""The device plugin API version the kubelet serves (Register) and accepts (plugin watcher)."""


class EventKind(enum.StrEnum):
    """What happened to a resource (or a DRA driver), as recorded in :attr:`KubeletStandIn.events`."""

    REGISTERED = "registered"
    REGISTER_FAILED = "register-failed"
    REPLACED = "replaced"
    DEVICES = "devices"
    DISCONNECTED = "disconnected"
    DEREGISTERED = "deregistered"
    PREPARED = "prepared"
    """DRA: NodePrepareResources answered every claim (the event's resource is the driver)."""
    PREPARE_FAILED = "prepare-failed"
    UNPREPARED = "unprepared"
    UNPREPARE_FAILED = "unprepare-failed"
    HEALTH = "health"
    """DRA: the driver's health stream changed devices' health (the detail names them)."""
    HEALTH_FAILED = "health-failed"
    """DRA: the health stream could not be opened or ended; tried again in 5 s."""


class Event(NamedTuple):
    """One event: ``(time.monotonic(), kind, resource, detail)``."""

    at: float
    kind: EventKind
    resource: str
    detail: str


@dataclass(frozen=True)
class DeviceView:
    """One device as the last ListAndWatch list described it."""

    id: str
    health: str
    numa_nodes: tuple[int, ...]

    @property
    def healthy(self) -> bool:
        """Whether the plugin reported it ``Healthy``."""
        return self.health == HEALTHY

    @classmethod
    def from_proto(cls, device: api_pb2.Device) -> DeviceView:
        """Convert a wire ``Device``."""
        return cls(device.ID, device.health, tuple(node.ID for node in device.topology.nodes))


@dataclass(frozen=True)
class ListRecord:
    """One ListAndWatch list as received, stamped with ``time.monotonic()``."""

    at: float
    devices: tuple[DeviceView, ...]


@dataclass(frozen=True)
class ResourceView:
    """A snapshot of one resource as the kubelet sees it."""

    name: str
    endpoint: str
    connected: bool
    devices: tuple[DeviceView, ...]
    options: api_pb2.DevicePluginOptions
    registrations: int

    @property
    def total(self) -> int:
        """Capacity: every device the plugin listed."""
        return len(self.devices)

    @property
    def healthy(self) -> int:
        """Allocatable: healthy devices while the stream is connected, else 0."""
        return sum(d.healthy for d in self.devices) if self.connected else 0


@dataclass(frozen=True)
class AllocationResult:
    """What :meth:`KubeletStandIn.allocate` chose and what the plugin answered."""

    device_ids: tuple[str, ...]
    response: api_pb2.AllocateResponse
    preferred: tuple[str, ...] | None
    pre_started: bool
    pod: tuple[str, str] = ("", "")
    """(namespace, name) of the pod the devices were booked to."""


class AdmissionError(Exception):
    """The kubelet would refuse the pod before or after asking the plugin."""


@dataclass(frozen=True)
class DraDevice:
    """One device of a prepared claim, as the DRA driver answered NodePrepareResources."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share: str = ""
    """The share's ID (``share_id``), for a share of a device; "" for a device held whole."""

    @classmethod
    def from_proto(cls, device: dra_pb2.Device) -> DraDevice:
        """Convert a wire ``Device``."""
        return cls(
            tuple(device.request_names),
            device.pool_name,
            device.device_name,
            tuple(device.cdi_device_ids),
            device.share_id,
        )


class DraCallError(Exception):
    """A DRA call failed as the kubelet would fail it (its text): the driver is not registered,
    the call failed, a claim came back with an error, or a claim asked for did not come back."""
