"""How a resource gets registered with the kubelet: the small interfaces between its parts.

Two registrations exist, chosen once per host start (:func:`devicehost.host.serving.mode.for_mode`):
``Register`` on ``kubelet.sock`` (:mod:`~devicehost.host.serving.kubelet_registrar`) and a socket in
the kubelet's ``plugins_registry`` dir (:mod:`~devicehost.host.serving.watcher_registrar`). Each
makes one :class:`Registrar` per resource. A registrar sees its resource only as an
:class:`Endpoint`, and the kubelet only as a :class:`SocketWatch` and a :class:`RegisterClient`,
so tests drive it with fakes of all three.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from structlog.typing import FilteringBoundLogger

from devicehost.host.serving.socket import ServedSocket
from devicehost.host.serving.streams import StreamSet
from devicehost.proto.deviceplugin.v1beta1 import api_pb2

BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 5.0


class SocketWatch(Protocol):
    """What a registrar reads of ``kubelet.sock`` (:class:`~devicehost.host.kubelet.socket_watch.KubeletSocketWatch`)."""

    @property
    def kubelet_socket(self) -> Path: ...
    @property
    def inode(self) -> int | None: ...
    @property
    def generation(self) -> int: ...
    async def wait_present(self) -> int: ...
    def subscribe(self, callback: Callable[[], None]) -> None: ...
    def unsubscribe(self, callback: Callable[[], None]) -> None: ...


class RegisterClient(Protocol):
    """The kubelet's ``Register`` (:class:`~devicehost.host.kubelet.client.KubeletClient`)."""

    async def register(self, resource: str, endpoint: str, options: api_pb2.DevicePluginOptions) -> None: ...


class Endpoint(Protocol):
    """What a registrar sees of the resource it registers."""

    name: str
    socket: ServedSocket
    streams: StreamSet
    log: FilteringBoundLogger

    @property
    def options(self) -> api_pb2.DevicePluginOptions: ...
    async def serve_again(self) -> None:
        """Stop serving the socket and serve a fresh one."""


@dataclass
class RegistrationStats:
    """Successful registrations of one resource."""

    reasons: Counter[str] = field(default_factory=Counter)
    """Registrations by reason: start, kubelet appeared, kubelet restarted, stream lost, ..."""
    last_seconds: float | None = None
    """How long the last registration took."""

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def record(self, reason: str, seconds: float) -> None:
        self.reasons[reason] += 1
        self.last_seconds = seconds


class Registrar(Protocol):
    """Keeps one resource registered with the kubelet, from ``start()`` until ``stop()``."""

    stats: RegistrationStats

    @property
    def registered(self) -> bool:
        """Registered with the current kubelet and streaming to it."""

    def prepare(self, server: grpc.aio.Server) -> None:
        """Add what this registration serves to a new server of the resource's socket."""

    def start(self) -> None: ...
    async def stop(self) -> None: ...
    def stream_lost(self, epoch: int) -> None:
        """A stream opened in registration ``epoch`` ended on the kubelet's side."""


class Registration(Protocol):
    """How every resource of one host start registers."""

    directory: Path
    """Where the resources' sockets are served."""
    watch: SocketWatch

    def registrar(self, endpoint: Endpoint) -> Registrar: ...
