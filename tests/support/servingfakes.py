"""Fakes at the seams of the units in devicehost.host.serving, for the tests in tests/unit.

A registrar sees the kubelet as a :class:`~devicehost.host.serving.registration.SocketWatch` and a
:class:`~devicehost.host.serving.registration.RegisterClient`, and its resource as an
:class:`~devicehost.host.serving.registration.Endpoint`: :class:`FakeSocketWatch`,
:class:`FakeRegisterClient` and :class:`FakeEndpoint` stand in for them. The endpoint's
:class:`~devicehost.host.serving.streams.StreamSet` and
:class:`~devicehost.host.serving.table.DeviceTable` are the real ones; :class:`KubeletStream`
holds a stream the way the DevicePlugin servicer's ListAndWatch does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from devicehost.hookspecs.types import Device
from devicehost.host.kubelet.client import RegisterError
from devicehost.host.serving.streams import StreamSet
from devicehost.host.serving.table import DeviceTable
from devicehost.proto.deviceplugin.v1beta1 import api_pb2

RESOURCE = "example.com/widget"


async def settle(rounds: int = 50) -> None:
    """Let every ready callback and task run a few times (for checking that nothing happens)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class FakeSocketWatch:
    """``kubelet.sock`` as a test sets it: each new file is a new inode and a new generation.

    ``generation`` and ``inode`` can also be set directly; :meth:`refresh` tells the subscribers,
    as the real watch does after any change in the dir.
    """

    def __init__(self, directory: Path, present: bool = True) -> None:
        self.kubelet_socket = directory / "kubelet.sock"
        self.inode: int | None = None
        self.generation = 0
        self.subscribers: set[Callable[[str | None], None]] = set()
        self.waiting = 0
        """How many callers are inside :meth:`wait_present` now."""
        self._present = asyncio.Event()
        self._next_inode = 1000
        if present:
            self._new_file()

    async def wait_present(self) -> int:
        self.waiting += 1
        try:
            while self.inode is None:
                await self._present.wait()
            return self.inode
        finally:
            self.waiting -= 1

    def subscribe(self, callback: Callable[[str | None], None]) -> None:
        self.subscribers.add(callback)

    def unsubscribe(self, callback: Callable[[str | None], None]) -> None:
        self.subscribers.discard(callback)

    def refresh(self, changed: str | None = None) -> None:
        """Tell every subscriber that ``changed`` in the dir changed (None: anything may have)."""
        for callback in list(self.subscribers):
            callback(changed)

    def appear(self) -> None:
        """A (new) kubelet listens on a new kubelet.sock file."""
        self._new_file()
        self.refresh()

    restart = appear

    def vanish(self) -> None:
        """kubelet.sock is removed."""
        self.inode = None
        self.generation += 1
        self._present.clear()
        self.refresh()

    def _new_file(self) -> None:
        self._next_inode += 1
        self.inode = self._next_inode
        self.generation += 1
        self._present.set()


class FakeSocket:
    """What a registrar reads of a resource's socket file: its name, its path, and whether it is gone."""

    def __init__(self, directory: Path, name: str = "devicehost-example.com_widget-abc.sock") -> None:
        self.directory = directory
        self.name = name
        self.is_gone = False
        self.binds = 0

    @property
    def path(self) -> Path:
        return self.directory / self.name

    def gone(self) -> bool:
        return self.is_gone

    def bind_again(self) -> None:
        self.is_gone = False
        self.binds += 1


class KubeletStream:
    """A ListAndWatch stream held open the way the servicer holds one.

    It ends when the host ends it (``StreamSet.end_all``) or when the kubelet drops it (:meth:`drop`).
    """

    def __init__(self, streams: StreamSet, table: DeviceTable) -> None:
        self.epoch: int | None = None
        self.opened = asyncio.Event()
        self.ended_by_host: bool | None = None
        self._streams = streams
        self._table = table
        self._dropped = False
        self.task = asyncio.create_task(self._run())

    @property
    def ended(self) -> bool:
        return self.task.done()

    def drop(self) -> None:
        """The kubelet ends the stream (its loop returns at the next wake-up)."""
        self._dropped = True
        self._table.wake_all()

    async def _run(self) -> None:
        with self._streams.open() as stream:
            self.epoch = stream.epoch
            self.opened.set()
            while not stream.ending and not self._dropped:
                await self._table.wait_for_change(self._table.version)
            self.ended_by_host = stream.ending


@dataclass
class RegisterCall:
    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    at: float = field(default_factory=time.monotonic)
    outcome: str = "pending"
    """pending, ok, failed or cancelled."""


class FakeRegisterClient:
    """The kubelet's Register: records each call; can fail n times, block, and open a stream."""

    def __init__(self) -> None:
        self.calls: list[RegisterCall] = []
        self.failures = 0
        """How many of the next calls raise RegisterError."""
        self.gate: asyncio.Event | None = None
        """When set, each call waits for this event before it answers."""
        self.stream_to: FakeEndpoint | None = None
        """When set, each successful call opens a ListAndWatch stream to it before answering."""
        self.on_call: Callable[[RegisterCall], None] | None = None
        self.streams: list[KubeletStream] = []

    def fail(self, times: int) -> None:
        self.failures = times

    def block(self) -> asyncio.Event:
        """Make every call wait until the returned event is set."""
        self.gate = asyncio.Event()
        return self.gate

    @property
    def succeeded(self) -> list[RegisterCall]:
        return [c for c in self.calls if c.outcome == "ok"]

    async def register(self, resource: str, endpoint: str, options: api_pb2.DevicePluginOptions) -> None:
        call = RegisterCall(resource, endpoint, options)
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.failures > 0:
                self.failures -= 1
                call.outcome = "failed"
                raise RegisterError(f"refused (call {len(self.calls)})")
            if self.stream_to is not None:
                stream = KubeletStream(self.stream_to.streams, self.stream_to.table)
                self.streams.append(stream)
                await stream.opened.wait()
        except asyncio.CancelledError:
            call.outcome = "cancelled"
            raise
        call.outcome = "ok"


class FakeEndpoint:
    """A resource as a registrar sees it, with a real StreamSet over a real DeviceTable.

    ``serve_again`` is recorded (in ``timeline`` too, next to the register calls when the client
    is given the same list); it ends the streams as the resource does, then binds a fake socket
    again or runs ``on_serve_again``.
    """

    def __init__(self, socket: Any, name: str = RESOURCE, devices: int = 2) -> None:
        self.name = name
        self.socket = socket
        self.table = DeviceTable([Device(f"d{n}") for n in range(devices)])
        self.streams = StreamSet(self.table, self._on_lost)
        self.log = structlog.get_logger("servingfakes").bind(resource=name)
        self.options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)
        self.registrar: Any = None
        """Told of lost streams (``stream_lost``), as the resource wires it."""
        self.lost: list[int] = []
        self.serve_again_calls = 0
        self.timeline: list[str] = []
        self.on_serve_again: Callable[[], Awaitable[None]] | None = None

    def _on_lost(self, epoch: int) -> None:
        self.lost.append(epoch)
        if self.registrar is not None:
            self.registrar.stream_lost(epoch)

    async def serve_again(self) -> None:
        self.serve_again_calls += 1
        self.timeline.append("serve_again")
        await self.streams.end_all()
        if self.on_serve_again is not None:
            await self.on_serve_again()
        elif isinstance(self.socket, FakeSocket):
            self.socket.bind_again()


class RecordingServer:
    """Takes the handlers a registrar adds to a gRPC server and calls them directly."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, Any]] = {}
        self.generic: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.handlers[service] = dict(handlers)

    async def call(self, service: str, method: str, request: Any) -> Any:
        handler = self.handlers[service][method]
        return await handler.unary_unary(request, None)
