"""PluginWatcherRegistrar: the resource's socket in plugins_registry, served again when the kubelet lost it.

The fake endpoint's ``serve_again`` does what the resource does: it ends the streams and prepares
a new server (here a :class:`RecordingServer`, whose handlers the tests call directly).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from servingfakes import (
    RESOURCE,
    FakeEndpoint,
    FakeSocket,
    FakeSocketWatch,
    KubeletStream,
    RecordingServer,
    settle,
)
from waiting import eventually

from devicehost.host.serving import watcher_registrar
from devicehost.host.serving.registration import BACKOFF_INITIAL
from devicehost.host.serving.socket import ServedSocket
from devicehost.host.serving.watcher_registrar import PluginWatcherRegistrar, PluginWatcherRegistration
from devicehost.proto.pluginregistration.v1 import api_pb2, api_pb2_grpc

SERVICE = "pluginregistration.Registration"


class Served:
    """The servers a registrar prepared, newest last (as the resource serves them)."""

    def __init__(self, registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint) -> None:
        self.servers: list[RecordingServer] = []
        self.times: list[float] = []
        self._registrar = registrar
        self._endpoint = endpoint

    async def serve(self) -> None:
        server = RecordingServer()
        self._registrar.prepare(server)  # type: ignore[arg-type]
        self._endpoint.socket.bind_again()
        self.servers.append(server)
        self.times.append(time.monotonic())

    async def notify(self, registered: bool, error: str = "") -> None:
        """The kubelet's plugin watcher reports on the socket served now."""
        request = api_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        answer = await self.servers[-1].call(SERVICE, "NotifyRegistrationStatus", request)
        assert isinstance(answer, api_pb2.RegistrationStatusResponse)


@pytest.fixture
def watch(tmp_path: Path) -> FakeSocketWatch:
    return FakeSocketWatch(tmp_path)


@pytest.fixture
def endpoint(tmp_path: Path) -> FakeEndpoint:
    return FakeEndpoint(FakeSocket(tmp_path))


@pytest.fixture
async def registrar(endpoint: FakeEndpoint, watch: FakeSocketWatch) -> AsyncIterator[PluginWatcherRegistrar]:
    registrar = PluginWatcherRegistrar(endpoint, watch)
    endpoint.registrar = registrar
    yield registrar
    await registrar.stop()
    await endpoint.streams.end_all()


@pytest.fixture
async def served(registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint) -> Served:
    """The registrar started on a first served socket, as the resource starts it."""
    served = Served(registrar, endpoint)
    await served.serve()
    endpoint.on_serve_again = served.serve
    registrar.start()
    return served


def open_stream(endpoint: FakeEndpoint) -> KubeletStream:
    return KubeletStream(endpoint.streams, endpoint.table)


async def test_prepare_serves_get_info_on_the_resource_socket(
    short_tmp: Path, watch: FakeSocketWatch
) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "w1", 0o600)
    endpoint = FakeEndpoint(socket)
    registrar = PluginWatcherRegistrar(endpoint, watch)
    server = grpc.aio.server()
    registrar.prepare(server)
    socket.bind(server)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket.path}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(api_pb2.InfoRequest(), timeout=2)
            assert info.type == "DevicePlugin"
            assert info.name == RESOURCE
            assert info.endpoint == str(socket.path)
            assert list(info.supported_versions) == ["v1beta1"]

            await stub.NotifyRegistrationStatus(api_pb2.RegistrationStatus(plugin_registered=True), timeout=2)
        assert dict(registrar.stats.reasons) == {"plugin watcher": 1}
    finally:
        await server.stop(None)
        socket.remove()


async def test_get_info_names_the_socket_served_now(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint
) -> None:
    server = RecordingServer()
    registrar.prepare(server)  # type: ignore[arg-type]
    endpoint.socket.name = "devicehost-example.com_widget-abc1.sock"  # bind picked another name

    info = await server.call(SERVICE, "GetInfo", api_pb2.InfoRequest())

    assert info.endpoint == str(endpoint.socket.directory / "devicehost-example.com_widget-abc1.sock")


async def test_a_registration_reported_by_the_kubelet_is_counted(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, served: Served
) -> None:
    assert not registrar.registered
    await served.notify(True)

    assert dict(registrar.stats.reasons) == {"plugin watcher": 1}
    assert registrar.stats.count == 1
    assert registrar.stats.last_seconds is not None
    assert registrar.stats.last_seconds >= 0
    assert not registrar.registered  # no stream yet

    stream = open_stream(endpoint)
    await stream.opened.wait()
    assert registrar.registered
    await settle()
    assert endpoint.serve_again_calls == 0


async def test_a_refused_registration_serves_again_after_a_growing_backoff(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, served: Served
) -> None:
    refused_at = time.monotonic()
    await served.notify(False, "bad name")
    assert not registrar.registered
    await eventually(lambda: endpoint.serve_again_calls == 1)
    assert served.times[-1] - refused_at >= BACKOFF_INITIAL / 2 - 0.002  # jittered down to half
    await settle()
    assert endpoint.serve_again_calls == 1  # the new socket has no refusal yet
    assert registrar.stats.count == 0

    refused_at = time.monotonic()
    await served.notify(False, "bad name")
    await eventually(lambda: endpoint.serve_again_calls == 2)
    assert served.times[-1] - refused_at >= 2 * BACKOFF_INITIAL / 2 - 0.002

    await served.notify(True)
    assert dict(registrar.stats.reasons) == {"plugin watcher": 1}
    await settle()
    assert endpoint.serve_again_calls == 2


async def test_a_new_socket_forgets_the_last_status(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, served: Served
) -> None:
    await served.notify(True)
    stream = open_stream(endpoint)
    await stream.opened.wait()
    assert registrar.registered

    await served.serve()  # prepared again: the kubelet has not reported on this socket yet
    assert not registrar.registered


async def test_socket_gone_is_served_again_at_once(
    registrar: PluginWatcherRegistrar,
    endpoint: FakeEndpoint,
    watch: FakeSocketWatch,
    served: Served,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watcher_registrar, "REREGISTER_WAIT", 60.0)
    watch.refresh()  # a change in the dir that is not ours
    await settle()
    assert endpoint.serve_again_calls == 0

    endpoint.socket.is_gone = True
    watch.refresh()
    await eventually(lambda: endpoint.serve_again_calls == 1, within=1.0)
    assert not endpoint.socket.gone()
    await settle()
    assert endpoint.serve_again_calls == 1


async def test_stream_lost_with_no_stream_left_serves_again_after_the_wait(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher_registrar, "REREGISTER_WAIT", 0.05)
    await served.notify(True)
    stream = open_stream(endpoint)
    await stream.opened.wait()

    dropped_at = time.monotonic()
    stream.drop()
    await eventually(lambda: endpoint.serve_again_calls == 1)
    assert served.times[-1] - dropped_at >= 0.05 - 0.002
    assert endpoint.lost == [0]
    await settle()
    assert endpoint.serve_again_calls == 1


async def test_stream_lost_with_streams_still_open_after_the_wait_does_not_serve_again(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher_registrar, "REREGISTER_WAIT", 0.05)
    await served.notify(True)
    first = open_stream(endpoint)
    await first.opened.wait()

    first.drop()
    # a restarted kubelet registers the socket by itself and opens a new stream meanwhile
    second = open_stream(endpoint)
    await second.opened.wait()
    await first.task
    assert endpoint.lost == [0]

    window = time.monotonic() + 0.25  # five times the wait: the registrar has decided by then
    while time.monotonic() < window:
        assert endpoint.serve_again_calls == 0
        await asyncio.sleep(0)
    assert registrar.registered

    # the loop is still alive: losing the last stream does serve again
    second.drop()
    await eventually(lambda: endpoint.serve_again_calls == 1)


async def test_stop_cancels_and_unsubscribes(
    registrar: PluginWatcherRegistrar, endpoint: FakeEndpoint, watch: FakeSocketWatch, served: Served
) -> None:
    assert len(watch.subscribers) == 1
    async with asyncio.timeout(1.0):
        await registrar.stop()
    assert watch.subscribers == set()

    endpoint.socket.is_gone = True
    watch.refresh()
    await served.notify(False, "refused after stop")
    await settle()
    assert endpoint.serve_again_calls == 0


async def test_registration_makes_watcher_registrars(
    tmp_path: Path, endpoint: FakeEndpoint, watch: FakeSocketWatch
) -> None:
    registration = PluginWatcherRegistration(tmp_path, watch)
    registrar = registration.registrar(endpoint)
    assert isinstance(registrar, PluginWatcherRegistrar)
    assert registration.directory == tmp_path

    server = RecordingServer()
    registrar.prepare(server)  # type: ignore[arg-type]
    assert set(server.handlers[SERVICE]) == {"GetInfo", "NotifyRegistrationStatus"}
