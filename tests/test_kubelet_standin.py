"""The kubelet stand-in against small bare grpc.aio plugins written here (not the devicehost host)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.proto.pluginregistration.v1 import api_pb2 as reg_pb2
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as reg_pb2_grpc
from devicehost.standin import AdmissionError, EventKind, KubeletStandIn

NAME = "example.com/widget"
Context = grpc.aio.ServicerContext[Any, Any]


def devices(*spec: str, numa: int | None = None) -> list[api_pb2.Device]:
    """``"w0"`` is healthy, ``"w1!"`` unhealthy."""
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    return [
        api_pb2.Device(
            ID=s.rstrip("!"), health="Unhealthy" if s.endswith("!") else "Healthy", topology=topology
        )
        for s in spec
    ]


class Plugin(api_pb2_grpc.DevicePluginServicer):
    """A bare device plugin: lists pushed through ``push``, calls recorded in ``calls``."""

    def __init__(self, initial: list[api_pb2.Device], **options: bool) -> None:
        self.options = api_pb2.DevicePluginOptions(**options)
        self.initial = initial
        self.queues: list[asyncio.Queue[list[api_pb2.Device] | None]] = []
        self.calls: list[str] = []
        self.requests: list[Any] = []
        self.stream_cancelled = asyncio.Event()
        self.register_returned = False
        self.options_before_reply: bool | None = None

    def push(self, update: list[api_pb2.Device] | None, stream: int = -1) -> None:
        """Send a new list on a stream (``None`` ends it)."""
        self.queues[stream].put_nowait(update)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        self.calls.append("GetDevicePluginOptions")
        self.options_before_reply = not self.register_returned
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.calls.append("ListAndWatch")
        queue: asyncio.Queue[list[api_pb2.Device] | None] = asyncio.Queue()
        self.queues.append(queue)
        update: list[api_pb2.Device] | None = self.initial
        try:
            while update is not None:
                yield api_pb2.ListAndWatchResponse(devices=update)
                update = await queue.get()
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        self.calls.append("GetPreferredAllocation")
        self.requests.append(request)
        container = request.container_requests[0]
        best = sorted(container.available_deviceIDs, reverse=True)[: container.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=best)]
        )

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        self.calls.append("Allocate")
        self.requests.append(request)
        known = {d.ID for d in self.initial}
        ids = list(request.container_requests[0].devices_ids)
        if not set(ids) <= known:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {ids}")
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs={"WIDGETS": ",".join(ids)})]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.append("PreStartContainer")
        self.requests.append(request)
        return api_pb2.PreStartContainerResponse()


class Info(reg_pb2_grpc.RegistrationServicer):
    """A bare pluginregistration servicer that records the kubelet's verdict."""

    def __init__(self, info: reg_pb2.PluginInfo, delay: float = 0) -> None:
        self.info = info
        self.delay = delay
        self.get_info_calls = 0
        self.statuses: list[reg_pb2.RegistrationStatus] = []
        self.status: asyncio.Future[reg_pb2.RegistrationStatus] = asyncio.get_running_loop().create_future()

    async def GetInfo(self, request: reg_pb2.InfoRequest, context: Context) -> reg_pb2.PluginInfo:
        self.get_info_calls += 1
        await asyncio.sleep(self.delay)
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: Context
    ) -> reg_pb2.RegistrationStatusResponse:
        self.statuses.append(request)
        if not self.status.done():
            self.status.set_result(request)
        return reg_pb2.RegistrationStatusResponse()


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="kst"))
    yield path
    shutil.rmtree(path)


class Servers:
    """Plugin servers started by a test, all stopped at its end."""

    def __init__(self) -> None:
        self.running: list[grpc.aio.Server] = []

    async def serve(
        self, path: Path, plugin: Plugin | None = None, info: Info | None = None
    ) -> grpc.aio.Server:
        server = grpc.aio.server()
        if plugin is not None:
            api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
        if info is not None:
            reg_pb2_grpc.add_RegistrationServicer_to_server(info, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self.running.append(server)
        return server


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    pool = Servers()
    yield pool
    await asyncio.gather(*(server.stop(None) for server in pool.running))


@pytest.fixture
async def kubelet(base: Path, servers: Servers) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(base / "dp", dial_timeout=0.3) as standin:
        yield standin


async def register(
    kubelet: KubeletStandIn,
    endpoint: str,
    name: str = NAME,
    version: str = "v1beta1",
    plugin: Plugin | None = None,
    **options: bool,
) -> None:
    """Call Register as a plugin would; flags ``plugin.register_returned`` when it returns."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        request = api_pb2.RegisterRequest(
            version=version,
            endpoint=endpoint,
            resource_name=name,
            options=api_pb2.DevicePluginOptions(**options),
        )
        await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)
    if plugin is not None:
        plugin.register_returned = True


async def serve_and_register(
    kubelet: KubeletStandIn, servers: Servers, plugin: Plugin, socket: str = "w.sock", name: str = NAME
) -> None:
    await servers.serve(kubelet.device_plugins_dir / socket, plugin)
    await register(kubelet, socket, name, plugin=plugin)


# -- Register -----------------------------------------------------------------------------------


async def test_register_dials_back_before_replying_and_ignores_request_options(
    kubelet: KubeletStandIn, servers: Servers
) -> None:
    plugin = Plugin(devices("w0", "w1", "w2!"))
    await servers.serve(kubelet.device_plugins_dir / "w.sock", plugin)
    await register(kubelet, "w.sock", plugin=plugin, pre_start_required=True)

    assert plugin.options_before_reply is True
    view = await kubelet.wait_for_resource(NAME, healthy=2, total=3)
    assert view.endpoint == str(kubelet.device_plugins_dir / "w.sock")
    assert kubelet.options(NAME).pre_start_required is False
    assert (kubelet.capacity(NAME), kubelet.allocatable(NAME), kubelet.unhealthy(NAME)) == (3, 2, 1)
    assert kubelet.resources == [NAME]
    assert kubelet.registrations(NAME) == 1
    assert [e.kind for e in kubelet.events] == [EventKind.REGISTERED, EventKind.DEVICES]


async def test_register_before_serving_fails(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin = Plugin(devices("w0"))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await register(kubelet, "w.sock")
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert (failed.value.details() or "").startswith("failed to dial device plugin:")
    assert kubelet.resources == []
    assert kubelet.events[-1].kind == EventKind.REGISTER_FAILED

    await serve_and_register(kubelet, servers, plugin)
    assert (await kubelet.wait_for_resource(NAME, healthy=1)).registrations == 1


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        (NAME, "v1alpha", 'requested API version "v1alpha" is not supported by kubelet'),
        ("widget", "v1beta1", 'the ResourceName "widget" is invalid'),
        ("kubernetes.io/widget", "v1beta1", 'the ResourceName "kubernetes.io/widget" is invalid'),
        ("requests.example.com/w", "v1beta1", "is invalid"),
    ],
)
async def test_register_rejects_version_and_name_without_dialling(
    kubelet: KubeletStandIn, servers: Servers, name: str, version: str, message: str
) -> None:
    plugin = Plugin(devices("w0"))
    await servers.serve(kubelet.device_plugins_dir / "w.sock", plugin)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await register(kubelet, "w.sock", name, version)
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert message in (failed.value.details() or "")
    assert plugin.calls == []
    assert kubelet.events[-1][1:3] == (EventKind.REGISTER_FAILED, name)


# -- ListAndWatch -------------------------------------------------------------------------------


async def test_history_records_every_list_with_topology(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin = Plugin(devices("w0", "w1", numa=1))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=2)
    plugin.push(devices("w0", "w1!", numa=1))
    await kubelet.wait_for_resource(NAME, healthy=1, total=2)
    mark = len(kubelet.events)
    plugin.push(devices("w0", "w1!", numa=1))
    plugin.push(devices("w0", "w1", "w2"))
    await kubelet.wait_for_resource(NAME, healthy=3)

    history = kubelet.history(NAME)
    assert [[(d.id, d.health) for d in record.devices] for record in history] == [
        [("w0", "Healthy"), ("w1", "Healthy")],
        [("w0", "Healthy"), ("w1", "Unhealthy")],
        [("w0", "Healthy"), ("w1", "Unhealthy")],
        [("w0", "Healthy"), ("w1", "Healthy"), ("w2", "Healthy")],
    ]
    assert [r.at for r in history] == sorted(r.at for r in history)
    assert history[0].devices[0].numa_nodes == (1,)
    assert history[-1].devices[2].numa_nodes == ()
    # The repeated list is recorded but is not a change.
    assert [e.detail for e in kubelet.events[mark:]] == ["3 of 3 healthy"]


async def test_list_observers_see_every_message_as_it_arrives(
    kubelet: KubeletStandIn, servers: Servers
) -> None:
    seen: list[tuple[str, list[str]]] = []
    kubelet.observe_lists(lambda resource, message: seen.append((resource, [d.ID for d in message.devices])))
    plugin = Plugin(devices("w0"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=1)
    plugin.push(devices("w0", "w1"))
    await kubelet.wait_for_resource(NAME, healthy=2)
    assert seen == [(NAME, ["w0"]), (NAME, ["w0", "w1"])]


@pytest.mark.parametrize("end", ["kubelet drops it", "plugin ends it"])
async def test_stream_end_disconnects_and_is_never_retried(
    kubelet: KubeletStandIn, servers: Servers, end: str
) -> None:
    plugin = Plugin(devices("w0", "w1"))
    other = Plugin(devices("o0"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=2)

    mark = len(kubelet.events)
    if end == "kubelet drops it":
        kubelet.drop_stream(NAME)
    else:
        plugin.push(None)
    event = await kubelet.wait_for_event(EventKind.DISCONNECTED, NAME, since=mark)
    assert "ListAndWatch" in event.detail
    assert (kubelet.capacity(NAME), kubelet.allocatable(NAME), kubelet.unhealthy(NAME)) == (2, 0, 2)
    assert kubelet.view(NAME).healthy == 0
    with pytest.raises(AdmissionError):
        await kubelet.allocate(NAME)

    # Give the stand-in a full registration's worth of work: it still has not retried.
    await serve_and_register(kubelet, servers, other, "o.sock", "example.com/other")
    await kubelet.wait_for_resource("example.com/other", healthy=1)
    assert plugin.calls.count("ListAndWatch") == 1
    assert kubelet.allocatable(NAME) == 0
    assert [e.kind for e in kubelet.events[mark:] if e.resource == NAME] == [EventKind.DISCONNECTED]

    await register(kubelet, "w.sock")
    await kubelet.wait_for_resource(NAME, healthy=2)
    assert kubelet.registrations(NAME) == 2
    assert plugin.calls.count("ListAndWatch") == 2


async def test_drop_stream_leaves_other_resources_alone(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin, other = Plugin(devices("w0")), Plugin(devices("o0"))
    await serve_and_register(kubelet, servers, plugin)
    await serve_and_register(kubelet, servers, other, "o.sock", "example.com/other")
    await kubelet.wait_for_resource("example.com/other", healthy=1)
    kubelet.drop_stream(NAME)
    await asyncio.wait_for(plugin.stream_cancelled.wait(), 5)
    await kubelet.wait_for_event(EventKind.DISCONNECTED, NAME, since=0)
    assert kubelet.allocatable("example.com/other") == 1
    assert not other.stream_cancelled.is_set()


# -- restart and crash --------------------------------------------------------------------------


async def test_restart_cleans_dir_except_checkpoint_and_gives_new_inode(
    kubelet: KubeletStandIn, servers: Servers
) -> None:
    dp = kubelet.device_plugins_dir
    (dp / "kubelet_internal_checkpoint").write_text("{}")
    (dp / "stale.sock").write_text("")
    (dp / "keep-dir").mkdir()
    plugin = Plugin(devices("w0"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=1)
    inode = kubelet.socket_path.stat().st_ino

    await kubelet.restart()

    assert sorted(p.name for p in dp.iterdir()) == ["keep-dir", "kubelet.sock", "kubelet_internal_checkpoint"]
    assert kubelet.socket_path.stat().st_ino != inode
    await asyncio.wait_for(plugin.stream_cancelled.wait(), 5)
    assert kubelet.allocatable(NAME) == 0
    assert kubelet.events[-1][1:] == (EventKind.DISCONNECTED, NAME, "kubelet restarted")
    # The plugin's socket is gone with the cleaning: it serves again and registers again.
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=1)
    assert kubelet.registrations(NAME) == 2


async def test_a_start_binds_kubelet_sock_before_it_listens(base: Path, servers: Servers) -> None:
    """As the kubelet's ``net.Listen``: the file appears first, connections are refused until it
    listens. (A plugin that registers the moment kubelet.sock appears must cope with that.)"""
    async with KubeletStandIn(base / "dp", dial_timeout=0.3, listen_delay=0.5) as kubelet:
        plugin = Plugin(devices("w0"))
        await serve_and_register(kubelet, servers, plugin)
        old = kubelet.socket_path.stat().st_ino
        restart = asyncio.create_task(kubelet.restart())
        while not (kubelet.socket_path.exists() and kubelet.socket_path.stat().st_ino != old):
            await asyncio.sleep(0.005)
        with (
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as early,
            pytest.raises(ConnectionRefusedError),
        ):
            early.connect(str(kubelet.socket_path))
        assert not restart.done()
        await restart
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late:
            late.connect(str(kubelet.socket_path))
        await serve_and_register(kubelet, servers, plugin)
        await kubelet.wait_for_resource(NAME, healthy=1)
        assert kubelet.registrations(NAME) == 2


async def test_crash_removes_socket_while_down(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin = Plugin(devices("w0"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=1)
    inode = kubelet.socket_path.stat().st_ino

    crash = asyncio.create_task(kubelet.crash(0.5))
    event = await kubelet.wait_for_event(EventKind.DISCONNECTED, NAME)
    assert event.detail == "kubelet crashed"
    assert not kubelet.socket_path.exists()
    with pytest.raises(grpc.aio.AioRpcError):
        await register(kubelet, "w.sock")
    await crash
    assert kubelet.socket_path.stat().st_ino != inode


# -- a second Register of the same resource -----------------------------------------------------


async def test_replace_on_132_keeps_old_stream_and_its_end_disconnects(
    kubelet: KubeletStandIn, servers: Servers
) -> None:
    old, new = Plugin(devices("w0")), Plugin(devices("w0", "w1"))
    await serve_and_register(kubelet, servers, old, "old.sock")
    await kubelet.wait_for_resource(NAME, healthy=1)
    await serve_and_register(kubelet, servers, new, "new.sock")
    await kubelet.wait_for_resource(NAME, healthy=2)
    assert kubelet.registrations(NAME) == 2
    assert any(e.kind == EventKind.REPLACED and "left open" in e.detail for e in kubelet.events)
    # The old stream is still open and, keyed by resource name, still updates the devices.
    old.push(devices("w0", "w1", "w2"))
    await kubelet.wait_for_resource(NAME, healthy=3)

    mark = len(kubelet.events)
    old.push(None)
    event = await kubelet.wait_for_event(EventKind.DISCONNECTED, NAME, since=mark)
    assert "replaced stream" in event.detail
    assert kubelet.allocatable(NAME) == 0
    # as kubelet 1.32 does (tests/kubelet/test_host_process.py): the current stream is closed too
    await asyncio.wait_for(new.stream_cancelled.wait(), 5)
    assert "current closed too" in event.detail


async def test_replace_on_newer_kubelet_closes_old_stream_quietly(base: Path, servers: Servers) -> None:
    async with KubeletStandIn(base / "dp", close_replaced_streams=True, dial_timeout=0.3) as kubelet:
        old, new = Plugin(devices("w0")), Plugin(devices("w0", "w1"))
        await serve_and_register(kubelet, servers, old, "old.sock")
        await kubelet.wait_for_resource(NAME, healthy=1)
        await serve_and_register(kubelet, servers, new, "new.sock")
        await asyncio.wait_for(old.stream_cancelled.wait(), 5)
        await kubelet.wait_for_resource(NAME, healthy=2)
        assert EventKind.DISCONNECTED not in [e.kind for e in kubelet.events]
        assert kubelet.allocatable(NAME) == 2


# -- allocation ---------------------------------------------------------------------------------


async def test_allocate_with_preferred_and_pre_start(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin = Plugin(
        devices("w0", "w1", "w2", "w3!"), get_preferred_allocation_available=True, pre_start_required=True
    )
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=3)

    first = await kubelet.allocate(NAME, 2)
    assert first.preferred == first.device_ids == ("w2", "w1")
    assert first.pre_started
    assert first.response.container_responses[0].envs["WIDGETS"] == "w2,w1"
    assert plugin.calls[-3:] == ["GetPreferredAllocation", "Allocate", "PreStartContainer"]
    preferred_request = plugin.requests[-3].container_requests[0]
    assert list(preferred_request.available_deviceIDs) == ["w0", "w1", "w2"]
    assert (list(preferred_request.must_include_deviceIDs), preferred_request.allocation_size) == ([], 2)
    assert list(plugin.requests[-1].devices_ids) == ["w2", "w1"]

    second = await kubelet.allocate(NAME)
    assert second.device_ids == ("w0",)
    assert list(plugin.requests[-3].container_requests[0].available_deviceIDs) == ["w0"]
    with pytest.raises(AdmissionError, match="Requested: 1, Available: 0"):
        await kubelet.allocate(NAME)
    kubelet.release(NAME, ["w1"])
    assert (await kubelet.allocate(NAME)).device_ids == ("w1",)


async def test_allocate_without_options_skips_preferred_and_pre_start(
    kubelet: KubeletStandIn, servers: Servers
) -> None:
    plugin = Plugin(devices("w0", "w1", "w2"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=3)
    result = await kubelet.allocate(NAME, 2)
    assert (result.device_ids, result.preferred, result.pre_started) == (("w0", "w1"), None, False)
    chosen = await kubelet.allocate(NAME, device_ids=["w2"])
    assert chosen.device_ids == ("w2",)
    assert plugin.calls.count("Allocate") == 2
    assert {"GetPreferredAllocation", "PreStartContainer"}.isdisjoint(plugin.calls)


async def test_allocate_ids_shows_the_plugins_grpc_status(kubelet: KubeletStandIn, servers: Servers) -> None:
    plugin = Plugin(devices("w0"))
    await serve_and_register(kubelet, servers, plugin)
    await kubelet.wait_for_resource(NAME, healthy=1)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await kubelet.allocate_ids(NAME, ["nope"])
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    response = await kubelet.allocate_ids(NAME, ["w0"])
    assert response.container_responses[0].envs == {"WIDGETS": "w0"}


# -- plugin watcher -----------------------------------------------------------------------------


@pytest.fixture
async def watching(base: Path, servers: Servers) -> AsyncIterator[KubeletStandIn]:
    async with KubeletStandIn(
        base / "dp", base / "reg", watcher=True, deprecation_file=True, dial_timeout=0.3
    ) as standin:
        yield standin


def plugin_info(
    name: str = NAME, endpoint: str = "", kind: str = "DevicePlugin", versions: Sequence[str] = ("v1beta1",)
) -> reg_pb2.PluginInfo:
    return reg_pb2.PluginInfo(type=kind, name=name, endpoint=endpoint, supported_versions=list(versions))


async def test_watcher_registers_and_deregisters_on_socket_removal(
    base: Path, watching: KubeletStandIn, servers: Servers
) -> None:
    assert (base / "dp" / "DEPRECATION").exists()
    hidden, info, plugin = Info(plugin_info()), Info(plugin_info()), Plugin(devices("w0", "w1"))
    await servers.serve(base / "reg" / ".hidden.sock", Plugin(devices("h0")), hidden)
    await servers.serve(base / "reg" / "w.sock", plugin, info)

    status = await asyncio.wait_for(info.status, 5)
    assert (status.plugin_registered, status.error) == (True, "")
    view = await watching.wait_for_resource(NAME, healthy=2)
    assert view.endpoint == str(base / "reg" / "w.sock")
    assert hidden.get_info_calls == 0

    os.unlink(base / "reg" / "w.sock")
    event = await watching.wait_for_event(EventKind.DEREGISTERED, NAME, since=0)
    assert event.detail == "plugin socket removed"
    assert watching.resources == []
    await asyncio.wait_for(plugin.stream_cancelled.wait(), 5)


async def test_watcher_connects_to_a_separate_endpoint(
    base: Path, watching: KubeletStandIn, servers: Servers
) -> None:
    plugin = Plugin(devices("w0"))
    await servers.serve(base / "w.sock", plugin)
    info = Info(plugin_info(endpoint=str(base / "w.sock")))
    await servers.serve(base / "reg" / "info.sock", info=info)
    assert (await asyncio.wait_for(info.status, 5)).plugin_registered
    assert (await watching.wait_for_resource(NAME, healthy=1)).endpoint == str(base / "w.sock")


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (plugin_info(kind="CSIPlugin"), "no handler registered for plugin type: CSIPlugin"),
        (plugin_info(versions=["v1alpha"]), "is not among plugin supported versions ['v1alpha']"),
        (plugin_info(name="widget"), 'the ResourceName "widget" is invalid'),
        (plugin_info(endpoint="/tmp/no-such-plugin.sock"), "failed to dial device plugin"),
    ],
)
async def test_watcher_reports_rejection_to_the_plugin(
    base: Path, watching: KubeletStandIn, servers: Servers, info: reg_pb2.PluginInfo, message: str
) -> None:
    servicer = Info(info)
    await servers.serve(base / "reg" / "w.sock", Plugin(devices("w0")), servicer)
    status = await asyncio.wait_for(servicer.status, 5)
    assert not status.plugin_registered
    assert message in status.error
    assert watching.events[-1].kind == EventKind.REGISTER_FAILED
    assert watching.resources == []


async def test_watcher_get_info_times_out_after_one_second(
    base: Path, watching: KubeletStandIn, servers: Servers
) -> None:
    slow = Info(plugin_info(), delay=3)
    await servers.serve(base / "reg" / "w.sock", Plugin(devices("w0")), slow)
    event = await watching.wait_for_event(EventKind.REGISTER_FAILED, since=0, timeout=3)
    assert "GetInfo" in event.detail
    assert "DEADLINE_EXCEEDED" in event.detail
    assert not slow.status.done()
    assert watching.resources == []


async def test_watcher_registers_existing_sockets_again_after_restart(
    base: Path, watching: KubeletStandIn, servers: Servers
) -> None:
    info, plugin = Info(plugin_info()), Plugin(devices("w0"))
    await servers.serve(base / "reg" / "w.sock", plugin, info)
    await watching.wait_for_resource(NAME, healthy=1)
    await watching.restart()
    assert (base / "dp" / "DEPRECATION").exists()
    await watching.wait_for_resource(NAME, healthy=1)
    assert watching.registrations(NAME) == 2
    assert plugin.calls.count("ListAndWatch") == 2


async def test_watcher_writes_no_deprecation_file_unless_asked(base: Path, servers: Servers) -> None:
    """kubelet 1.32's device-plugin handler writes no DEPRECATION (tests/kubelet/test_registration.py)."""
    info, plugin = Info(plugin_info()), Plugin(devices("w0"))
    async with KubeletStandIn(base / "dp", base / "reg", watcher=True, dial_timeout=0.3) as standin:
        await servers.serve(base / "reg" / "w.sock", plugin, info)
        await standin.wait_for_resource(NAME, healthy=1)
        assert not (base / "dp" / "DEPRECATION").exists()


# -- lifecycle ----------------------------------------------------------------------------------


async def test_stop_leaves_no_task_running(base: Path, servers: Servers) -> None:
    kubelet = KubeletStandIn(base / "dp", base / "reg", watcher=True)
    await kubelet.start()
    await serve_and_register(kubelet, servers, Plugin(devices("w0")))
    await kubelet.wait_for_resource(NAME, healthy=1)
    await kubelet.stop()
    names = [t.get_name() for t in asyncio.all_tasks()]
    assert [n for n in names if n.startswith(("ListAndWatch", "plugin watcher"))] == []
    assert not kubelet.socket_path.exists()
    await asyncio.gather(*(server.stop(None) for server in servers.running))
    # grpc.aio's stop() can return a few loop turns before its own rpc tasks end; a task the
    # stand-in leaked never ends, so wait out the first and fail on the second.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
    while (left := asyncio.all_tasks() - {asyncio.current_task()}) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert sorted(task.get_name() for task in left) == []


async def test_wait_for_resource_says_what_it_saw(kubelet: KubeletStandIn, servers: Servers) -> None:
    await serve_and_register(kubelet, servers, Plugin(devices("w0", "w1!")))
    with pytest.raises(
        AssertionError, match=r"streaming, 1 registrations, devices \[w0:Healthy, w1:Unhealthy\]"
    ):
        await kubelet.wait_for_resource(NAME, healthy=2, timeout=0.2)
    with pytest.raises(AssertionError, match="never registered"):
        await kubelet.wait_for_resource("example.com/none", timeout=0.01)
