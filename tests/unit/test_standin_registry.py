"""ResourceRegistry: the stand-in's records of resources, against bare grpc.aio plugins (no kubelet.sock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import ConnectError, PluginConnection
from devicehost.standin.events import EventLog
from devicehost.standin.model import AdmissionError, DeviceView, EventKind
from devicehost.standin.registry import ResourceRecord, ResourceRegistry, describe_options

NAME = "example.com/widget"
Context = grpc.aio.ServicerContext[Any, Any]
Update = list[api_pb2.Device] | None


def devices(*spec: str) -> list[api_pb2.Device]:
    """``"w0"`` is healthy, ``"w1!"`` unhealthy."""
    return [
        api_pb2.Device(ID=s.rstrip("!"), health="Unhealthy" if s.endswith("!") else "Healthy") for s in spec
    ]


class Plugin(api_pb2_grpc.DevicePluginServicer):
    """A bare device plugin: ``push`` sends a list on its latest stream (``None`` ends it)."""

    def __init__(self, *spec: str, **options: bool) -> None:
        self.options = api_pb2.DevicePluginOptions(**options)
        self.initial = devices(*spec)
        self.queues: list[asyncio.Queue[Update]] = []
        self.cancelled = asyncio.Event()

    def push(self, update: Update) -> None:
        self.queues[-1].put_nowait(update)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        queue: asyncio.Queue[Update] = asyncio.Queue()
        self.queues.append(queue)
        update: Update = self.initial
        try:
            while update is not None:
                yield api_pb2.ListAndWatchResponse(devices=update)
                update = await queue.get()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


Serve = Callable[[Path, Plugin], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[grpc.aio.Server] = []

    async def start(path: Path, plugin: Plugin) -> str:
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        servers.append(server)
        return str(path)

    yield start
    await asyncio.gather(*(s.stop(None) for s in servers))


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
async def registry(events: EventLog) -> AsyncIterator[ResourceRegistry]:
    records = ResourceRegistry(events)
    yield records
    await records.disconnect_all("test over")


async def connect(registry: ResourceRegistry, path: str, *, close_replaced: bool = False) -> None:
    await registry.connect(
        NAME, path, dial_timeout=2, close_replaced=close_replaced, still_current=lambda: True
    )


def kinds(events: EventLog) -> list[EventKind]:
    return [e.kind for e in events.since(0)]


# -- records without a plugin -----------------------------------------------------------------


def test_a_record_describes_itself_and_its_view_counts_healthy_only_while_connected() -> None:
    record = ResourceRecord(
        NAME, devices=(DeviceView("w0", "Healthy", ()), DeviceView("w1", "Unhealthy", (0,)))
    )
    assert record.describe() == "disconnected, 0 registrations, devices [w0:Healthy, w1:Unhealthy]"
    assert (record.view().total, record.view().healthy) == (2, 0)
    record.connected = True
    assert record.describe().startswith("connected,")
    assert record.view().healthy == 1
    record.streaming = True
    assert record.describe().startswith("streaming,")


def test_a_record_counts_streaming_from_the_current_connections_first_list_only() -> None:
    record = ResourceRecord(NAME, connected=True)
    one = (DeviceView("w0", "Healthy", ()),)
    assert record.take_list(one, from_current=False) is True  # a replaced stream's list still counts
    assert (record.devices, record.streaming) == (one, False)
    assert record.take_list(one, from_current=True) is False  # the same list again: no change
    assert record.streaming is True
    assert [r.devices for r in record.history] == [one, one]


async def test_adopting_a_connection_is_one_more_registration(short_tmp: Path) -> None:
    def ignore(*_: object) -> None:
        return None

    record = ResourceRecord(NAME, streaming=True)
    first = PluginConnection(NAME, str(short_tmp / "a.sock"), ignore, ignore)
    second = PluginConnection(NAME, str(short_tmp / "b.sock"), ignore, ignore)
    try:
        options = api_pb2.DevicePluginOptions(pre_start_required=True)
        assert record.adopt(first, options) is None
        assert record.adopt(second, api_pb2.DevicePluginOptions()) is first
        assert (record.conn, record.endpoint, record.registrations) == (second, str(short_tmp / "b.sock"), 2)
        assert (record.connected, record.streaming, record.options.pre_start_required) == (True, False, False)
    finally:
        await asyncio.gather(first.close(), second.close())


def test_options_are_described_as_the_kubelet_reads_them() -> None:
    options = api_pb2.DevicePluginOptions(pre_start_required=True)
    assert describe_options(options) == "pre_start_required=True get_preferred_allocation_available=False"


def test_an_unknown_resource_has_no_record(registry: ResourceRegistry) -> None:
    assert (registry.names, registry.get(NAME)) == ([], None)
    with pytest.raises(KeyError):
        registry[NAME]
    with pytest.raises(KeyError):
        registry.stub(NAME)


# -- connect, lists, stream ends ----------------------------------------------------------------


async def test_connect_records_registers_and_streams(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    path = await serve(
        short_tmp / "w.sock", Plugin("w0", "w1", "w2!", get_preferred_allocation_available=True)
    )
    await connect(registry, path)

    record = registry[NAME]
    assert (record.endpoint, record.registrations, record.connected) == (path, 1, True)
    assert record.options.get_preferred_allocation_available
    view = await registry.wait_for(NAME, healthy=2, total=3, timeout=5)
    assert [d.id for d in view.devices] == ["w0", "w1", "w2"]
    events = events.since(0)
    assert [e.kind for e in events] == [EventKind.REGISTERED, EventKind.DEVICES]
    assert events[0].detail == f"endpoint {path}, options {describe_options(record.options)}"
    assert events[1].detail == "2 of 3 healthy"
    assert registry.names == [NAME]


async def test_a_repeated_list_is_recorded_but_is_no_event(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    plugin = Plugin("w0")
    await connect(registry, await serve(short_tmp / "w.sock", plugin))
    await registry.wait_for(NAME, healthy=1, total=1, timeout=5)
    mark = len(events)
    plugin.push(devices("w0"))
    plugin.push(devices("w0!"))
    await registry.wait_for(NAME, healthy=0, total=1, timeout=5)
    assert len(registry[NAME].history) == 3
    assert [e.detail for e in events.since(mark)] == ["0 of 1 healthy"]


async def test_a_dial_that_fails_leaves_no_record(
    registry: ResourceRegistry, events: EventLog, short_tmp: Path
) -> None:
    with pytest.raises(ConnectError, match=r"failed to dial device plugin: .*context deadline exceeded"):
        await registry.connect(
            NAME,
            str(short_tmp / "none.sock"),
            dial_timeout=0.2,
            close_replaced=False,
            still_current=lambda: True,
        )
    assert (registry.names, len(events)) == ([], 0)


async def test_a_kubelet_restart_during_the_dial_fails_the_registration(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    plugin = Plugin("w0")
    path = await serve(short_tmp / "w.sock", plugin)
    with pytest.raises(ConnectError, match="kubelet restarted during the registration"):
        await registry.connect(NAME, path, dial_timeout=2, close_replaced=False, still_current=lambda: False)
    assert (registry.names, len(events), plugin.queues) == ([], 0, [])


@pytest.mark.parametrize(
    ("end", "reason"), [("drop", "cancelled by the kubelet"), ("plugin", "ended by the plugin")]
)
async def test_a_stream_end_disconnects_and_keeps_the_record(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path, end: str, reason: str
) -> None:
    plugin = Plugin("w0", "w1")
    await connect(registry, await serve(short_tmp / "w.sock", plugin))
    await registry.wait_for(NAME, healthy=2, total=2, timeout=5)
    mark = len(events)
    if end == "drop":
        registry.drop_stream(NAME)
    else:
        plugin.push(None)
    event = await events.wait_for(EventKind.DISCONNECTED, NAME, mark, timeout=5)
    assert reason in event.detail
    record = registry[NAME]
    assert (record.connected, record.streaming, record.view().healthy, record.view().total) == (
        False,
        False,
        0,
        2,
    )
    with pytest.raises(AssertionError, match="disconnected, 1 registrations"):
        await registry.wait_for(NAME, healthy=2, total=None, timeout=0.05)


async def test_a_replaced_stream_left_open_still_updates_and_its_end_disconnects(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    old, new = Plugin("w0"), Plugin("w0", "w1")
    old_path = await serve(short_tmp / "old.sock", old)
    await connect(registry, old_path)
    await registry.wait_for(NAME, healthy=1, total=1, timeout=5)
    await connect(registry, await serve(short_tmp / "new.sock", new))
    await registry.wait_for(NAME, healthy=2, total=2, timeout=5)
    replaced = [e for e in events.since(0) if e.kind == EventKind.REPLACED]
    assert [e.detail for e in replaced] == [f"{old_path} replaced, its stream left open"]

    old.push(devices("w0", "w1", "w2"))
    await registry.wait_for(NAME, healthy=3, total=3, timeout=5)
    mark = len(events)
    old.push(None)
    event = await events.wait_for(EventKind.DISCONNECTED, NAME, mark, timeout=5)
    assert event.detail.startswith(f"the replaced stream from {old_path} ended")
    assert not new.cancelled.is_set()


async def test_a_replaced_stream_is_closed_quietly_when_asked(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    old, new = Plugin("w0"), Plugin("w0", "w1")
    await connect(registry, await serve(short_tmp / "old.sock", old))
    await registry.wait_for(NAME, healthy=1, total=1, timeout=5)
    await connect(registry, await serve(short_tmp / "new.sock", new), close_replaced=True)
    await asyncio.wait_for(old.cancelled.wait(), 5)
    await registry.wait_for(NAME, healthy=2, total=2, timeout=5)
    assert EventKind.DISCONNECTED not in kinds(events)
    assert registry[NAME].registrations == 2


async def test_disconnect_all_closes_every_stream_and_keeps_the_records(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    plugin = Plugin("w0")
    await connect(registry, await serve(short_tmp / "w.sock", plugin))
    await registry.wait_for(NAME, healthy=1, total=1, timeout=5)
    await registry.disconnect_all("kubelet restarted")
    assert events.since(0)[-1][1:] == (EventKind.DISCONNECTED, NAME, "kubelet restarted")
    await asyncio.wait_for(plugin.cancelled.wait(), 5)
    assert registry.names == [NAME]
    assert registry[NAME].conn is None
    with pytest.raises(AdmissionError, match="no plugin connection"):
        registry.stub(NAME)
    await registry.disconnect_all("again")  # nothing connected: no second event
    assert kinds(events).count(EventKind.DISCONNECTED) == 1


async def test_deregister_forgets_the_resource(
    registry: ResourceRegistry, events: EventLog, serve: Serve, short_tmp: Path
) -> None:
    plugin = Plugin("w0")
    await connect(registry, await serve(short_tmp / "w.sock", plugin))
    await registry.wait_for(NAME, healthy=1, total=1, timeout=5)
    await registry.deregister(NAME)
    assert registry.names == []
    assert events.since(0)[-1][1:] == (EventKind.DEREGISTERED, NAME, "plugin socket removed")
    await asyncio.wait_for(plugin.cancelled.wait(), 5)
    mark = len(events)
    await registry.deregister(NAME)
    assert len(events) == mark
