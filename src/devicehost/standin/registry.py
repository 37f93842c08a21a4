"""The device manager's records: one per resource the kubelet has heard of, and its connection.

A record is made by the first successful registration and outlives its connections (a kubelet
restart, a dropped stream): only the plugin watcher's deregistration removes it. Device lists
from ``ListAndWatch`` land here, and every change is reported to the :class:`EventLog`.

(Not to be confused with the kubelet's ``plugins_registry`` dir: that belongs to the plugin
watcher, :mod:`devicehost.standin.plugin_watcher`.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import ConnectError, PluginConnection
from devicehost.standin.events import EventLog
from devicehost.standin.model import AdmissionError, DeviceView, EventKind, ListRecord, ResourceView

ListObserver = Callable[[str, api_pb2.ListAndWatchResponse], None]
"""Told ``(resource, message)`` for every ListAndWatch message the stand-in receives."""


@dataclass
class ResourceRecord:
    """What the kubelet holds for one resource."""

    name: str
    conn: PluginConnection | None = None
    endpoint: str = ""
    options: api_pb2.DevicePluginOptions = field(default_factory=api_pb2.DevicePluginOptions)
    connected: bool = False
    streaming: bool = False
    registrations: int = 0
    devices: tuple[DeviceView, ...] = ()
    history: list[ListRecord] = field(default_factory=list)
    allocated: set[str] = field(default_factory=set)

    def available_ids(self) -> list[str]:
        """Healthy devices not allocated to a container, in the plugin's list order."""
        return [d.id for d in self.devices if d.healthy and d.id not in self.allocated]

    def adopt(self, conn: PluginConnection, options: api_pb2.DevicePluginOptions) -> PluginConnection | None:
        """Make ``conn`` the resource's connection (a registration); the one it replaces, if any."""
        old = self.conn
        self.conn, self.endpoint, self.options = conn, conn.socket_path, options
        self.connected, self.streaming = True, False
        self.registrations += 1
        return old

    def take_list(self, devices: tuple[DeviceView, ...], *, from_current: bool) -> bool:
        """Record one ListAndWatch list; whether it changed the devices.

        The resource counts as streaming once its current connection has sent a list.
        """
        self.history.append(ListRecord(time.monotonic(), devices))
        self.streaming = self.streaming or from_current
        if devices == self.devices:
            return False
        self.devices = devices
        return True

    def view(self) -> ResourceView:
        """A frozen snapshot, as tests see it."""
        return ResourceView(
            self.name, self.endpoint, self.connected, self.devices, self.options, self.registrations
        )

    def describe(self) -> str:
        """State, registrations and device health, for a failed wait's message."""
        state = "streaming" if self.streaming else "connected" if self.connected else "disconnected"
        health = ", ".join(f"{d.id}:{d.health}" for d in self.devices)
        return f"{state}, {self.registrations} registrations, devices [{health}]"


def describe_options(options: api_pb2.DevicePluginOptions) -> str:
    """The two options the kubelet acts on, for the ``registered`` event."""
    return (
        f"pre_start_required={options.pre_start_required} "
        f"get_preferred_allocation_available={options.get_preferred_allocation_available}"
    )


class ResourceRegistry:
    """Records by resource name, the open plugin connections, and what happens to them."""

    def __init__(self, events: EventLog) -> None:
        self._records: dict[str, ResourceRecord] = {}
        self._conns: set[PluginConnection] = set()
        self._events = events
        self.list_observers: list[ListObserver] = []
        """Called with every ListAndWatch message as it arrives, before the stand-in reads it."""

    @property
    def names(self) -> list[str]:
        """Every resource with a record, sorted."""
        return sorted(self._records)

    def get(self, name: str) -> ResourceRecord | None:
        """The record of ``name``, or ``None`` when it never registered."""
        return self._records.get(name)

    def __getitem__(self, name: str) -> ResourceRecord:
        return self._records[name]

    def stub(self, name: str) -> api_pb2_grpc.DevicePluginAsyncStub:
        """The current connection's stub; ``AdmissionError`` when there is none."""
        conn = self._records[name].conn
        if conn is None:
            raise AdmissionError(f"{name}: no plugin connection")
        return conn.stub

    def drop_stream(self, name: str) -> None:
        """Cancel ``name``'s ListAndWatch from the kubelet side; it is never retried."""
        conn = self._records[name].conn
        if conn is not None:
            conn.drop()

    async def wait_for(
        self,
        name: str,
        healthy: int | None,
        total: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> ResourceView:
        """Wait until ``name`` is connected, streaming, and its latest list matches the counts.

        Raises ``AssertionError`` saying what was seen when that does not happen within ``timeout``.
        """

        def done() -> bool:
            res = self._records.get(name)
            return (
                res is not None
                and res.connected
                and res.streaming
                and (healthy is None or res.view().healthy == healthy)
                and (total is None or len(res.devices) == total)
            )

        try:
            async with asyncio.timeout(timeout):
                await self._events.wait_until(done)
            return self._records[name].view()
        except TimeoutError:
            pass
        res = self._records.get(name)
        seen = "never registered" if res is None else res.describe()
        raise AssertionError(
            f"{name}: wanted healthy={healthy} total={total} within {timeout}s, saw {seen}; "
            f"last events: {self._events.recent(name)}"
        )

    async def connect(
        self,
        name: str,
        socket_path: str,
        *,
        dial_timeout: float,
        close_replaced: bool,
        still_current: Callable[[], bool],
    ) -> None:
        """Dial ``socket_path``, get its options, record it as ``name``'s connection, open ListAndWatch.

        ``still_current`` is asked after the dial: false means the kubelet restarted meanwhile,
        and the registration fails as a real kubelet's handler would die with it.
        """
        conn = PluginConnection(name, socket_path, self._on_list, self._on_stream_end)
        try:
            options = await conn.connect(dial_timeout)
            if not still_current():
                raise ConnectError("kubelet restarted during the registration")
        except BaseException:
            await conn.close()
            raise
        self._conns.add(conn)
        old = self._records.setdefault(name, ResourceRecord(name)).adopt(conn, options)
        if old is not None:
            how = "closed" if close_replaced else "left open"
            self._events.emit(EventKind.REPLACED, name, f"{old.socket_path} replaced, its stream {how}")
            if close_replaced:
                await old.close()
        self._events.emit(
            EventKind.REGISTERED, name, f"endpoint {socket_path}, options {describe_options(options)}"
        )
        conn.start_stream()

    async def deregister(self, name: str) -> None:
        """Forget ``name`` and close its connection (its plugin-watcher socket went away)."""
        res = self._records.pop(name, None)
        if res is None:
            return
        if res.conn is not None:
            await res.conn.close()
        self._events.emit(EventKind.DEREGISTERED, name, "plugin socket removed")

    async def disconnect_all(self, reason: str) -> None:
        """Mark every resource disconnected and close every connection; the records stay."""
        for res in self._records.values():
            res.conn = None
            res.streaming = False
            if res.connected:
                res.connected = False
                self._events.emit(EventKind.DISCONNECTED, res.name, reason)
        await asyncio.gather(*(conn.close() for conn in list(self._conns)))

    def _on_list(self, conn: PluginConnection, response: api_pb2.ListAndWatchResponse) -> None:
        for observe in self.list_observers:
            observe(conn.resource, response)
        res = self._records.get(conn.resource)
        if res is None or conn.closing:
            return
        # Kubelet 1.32 keys updates by resource name: a replaced stream still updates devices.
        devices = tuple(DeviceView.from_proto(d) for d in response.devices)
        if res.take_list(devices, from_current=conn is res.conn):
            healthy = sum(d.healthy for d in devices)
            self._events.emit(EventKind.DEVICES, res.name, f"{healthy} of {len(devices)} healthy")
        else:
            self._events.changed()

    def _on_stream_end(self, conn: PluginConnection, reason: str) -> None:
        self._conns.discard(conn)
        res = self._records.get(conn.resource)
        if conn.closing or res is None or not res.connected:
            return
        if conn is not res.conn and res.conn is not None:
            # kubelet 1.32's runClient disconnects the current client when any stream ends
            reason = f"the replaced stream from {conn.socket_path} ended ({reason}); current closed too"
            res.conn.closing = True
            res.conn.drop()
        res.connected = res.streaming = False
        self._events.emit(EventKind.DISCONNECTED, res.name, reason)
