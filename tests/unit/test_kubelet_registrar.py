"""KubeletRegistrar: keeps one resource registered through Register on kubelet.sock.

Driven with fakes at its seams: the socket watch, the kubelet's Register, and the resource (an
endpoint with a real StreamSet). The fake kubelet opens a ListAndWatch stream on each successful
Register, as the real one does before it answers.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog.testing
from servingfakes import (
    RESOURCE,
    FakeEndpoint,
    FakeRegisterClient,
    FakeSocket,
    FakeSocketWatch,
    KubeletStream,
    RecordingServer,
    settle,
)
from waiting import eventually

from devicehost.host.serving import kubelet_registrar
from devicehost.host.serving.kubelet_registrar import KubeletRegistrar, KubeletRegistration
from devicehost.host.serving.registration import BACKOFF_INITIAL, RegistrationStats
from devicehost.host.serving.socket import ServedSocket


@pytest.fixture
def watch(tmp_path: Path) -> FakeSocketWatch:
    return FakeSocketWatch(tmp_path)


@pytest.fixture
def endpoint(tmp_path: Path) -> FakeEndpoint:
    return FakeEndpoint(FakeSocket(tmp_path))


@pytest.fixture
def client(endpoint: FakeEndpoint) -> FakeRegisterClient:
    client = FakeRegisterClient()
    client.stream_to = endpoint
    client.on_call = lambda call: endpoint.timeline.append("register")
    return client


@pytest.fixture
async def registrar(
    endpoint: FakeEndpoint, watch: FakeSocketWatch, client: FakeRegisterClient
) -> AsyncIterator[KubeletRegistrar]:
    """A registrar wired to the fakes (not started); stopped and its streams ended afterwards."""
    registrar = KubeletRegistrar(endpoint, watch, client)
    endpoint.registrar = registrar
    yield registrar
    await registrar.stop()
    await endpoint.streams.end_all()
    await asyncio.gather(*(s.task for s in client.streams), return_exceptions=True)


def reasons(registrar: KubeletRegistrar) -> dict[str, int]:
    return dict(registrar.stats.reasons)


async def test_registers_once_at_start_with_reason_start(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered, what="registered")
    await settle()

    assert len(client.calls) == 1
    call = client.calls[0]
    assert (call.resource, call.endpoint, call.options) == (RESOURCE, endpoint.socket.name, endpoint.options)
    assert call.outcome == "ok"
    assert reasons(registrar) == {"start": 1}
    assert registrar.stats.count == 1
    assert registrar.stats.last_seconds is not None
    assert registrar.stats.last_seconds >= 0
    assert endpoint.streams.epoch == 1
    assert client.streams[0].epoch == 1
    assert endpoint.serve_again_calls == 0
    assert len(watch.subscribers) == 1


async def test_a_dir_change_that_changes_nothing_does_not_register_again(
    registrar: KubeletRegistrar, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)
    watch.refresh()
    watch.refresh()
    await settle()

    assert len(client.calls) == 1
    assert registrar.registered


async def test_waits_while_kubelet_sock_is_absent_then_registers_when_it_appears(
    tmp_path: Path, endpoint: FakeEndpoint, client: FakeRegisterClient
) -> None:
    watch = FakeSocketWatch(tmp_path, present=False)
    registrar = KubeletRegistrar(endpoint, watch, client)
    endpoint.registrar = registrar
    registrar.start()
    try:
        await eventually(lambda: watch.waiting == 1, what="waiting for kubelet.sock")
        await settle()
        assert client.calls == []
        assert not registrar.registered

        watch.appear()
        await eventually(lambda: registrar.registered)
        await settle()
        assert len(client.calls) == 1
        assert reasons(registrar) == {"kubelet appeared": 1}
        assert watch.waiting == 0
    finally:
        await registrar.stop()
        await endpoint.streams.end_all()


async def test_kubelet_sock_removed_then_back_registers_as_kubelet_appeared(
    registrar: KubeletRegistrar, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)

    watch.vanish()
    assert not registrar.registered
    await eventually(lambda: watch.waiting == 1, what="waiting for kubelet.sock")
    await settle()
    assert len(client.calls) == 1

    watch.appear()
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    assert reasons(registrar) == {"start": 1, "kubelet appeared": 1}


async def test_new_kubelet_generation_ends_old_streams_then_registers_again(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)
    old = client.streams[0]
    seen_at_register: list[tuple[int, int, bool | None]] = []
    client.on_call = lambda call: seen_at_register.append(
        (endpoint.streams.count, endpoint.streams.epoch, old.ended_by_host)
    )

    watch.restart()
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    await settle()

    # the old stream had ended (by the host) and a new epoch begun before Register was called
    assert seen_at_register == [(0, 2, True)]
    assert old.ended_by_host is True
    assert endpoint.lost == []  # ending it on purpose is not a lost stream
    assert client.streams[1].epoch == 2
    assert len(client.calls) == 2
    assert reasons(registrar) == {"start": 1, "kubelet restarted": 1}


async def test_stream_lost_in_the_current_epoch_registers_again(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)

    client.streams[0].drop()  # the kubelet ends the stream: the resource is told stream_lost(1)
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    await settle()

    assert endpoint.lost == [1]
    assert len(client.calls) == 2
    assert reasons(registrar) == {"start": 1, "stream lost": 1}
    assert endpoint.streams.epoch == 2


async def test_stream_lost_of_an_old_epoch_changes_nothing(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)
    assert endpoint.streams.epoch == 1

    registrar.stream_lost(0)
    await settle()
    assert len(client.calls) == 1
    assert registrar.registered

    # Had the old epoch's loss been taken, the next registration would count as "stream lost".
    watch.restart()
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    await settle()
    assert len(client.calls) == 2
    assert reasons(registrar) == {"start": 1, "kubelet restarted": 1}


async def test_register_error_retries_with_jittered_doubling_backoff_logged_once(
    registrar: KubeletRegistrar, client: FakeRegisterClient
) -> None:
    assert BACKOFF_INITIAL == 0.02
    client.fail(3)
    with structlog.testing.capture_logs() as logs:
        registrar.start()
        await eventually(lambda: registrar.registered, within=3.0)

    assert [c.outcome for c in client.calls] == ["failed", "failed", "failed", "ok"]
    failed = [e for e in logs if e["event"] == "register failed"]
    assert len({e["error"] for e in failed}) == len(failed), "logged once per change of error"
    assert 0.01 <= failed[0]["retry_in"] <= 0.02
    gaps = [b.at - a.at for a, b in zip(client.calls, client.calls[1:], strict=False)]
    for gap, base in zip(gaps, [0.02, 0.04, 0.08], strict=True):
        assert gap >= base / 2 - 0.002, gaps
    registered = [e for e in logs if e["event"] == "registered"]
    assert registered[-1]["failed_tries"] == 3
    assert reasons(registrar) == {"start": 1}


async def test_register_backoff_is_capped_and_a_new_kubelet_resets_it(
    registrar: KubeletRegistrar,
    client: FakeRegisterClient,
    watch: FakeSocketWatch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubelet_registrar, "BACKOFF_INITIAL", 0.01)
    monkeypatch.setattr(kubelet_registrar, "BACKOFF_MAX", 0.04)
    client.fail(6)
    registrar.start()
    await eventually(lambda: registrar.registered)
    gaps = [b.at - a.at for a, b in zip(client.calls, client.calls[1:], strict=False)]
    assert all(gap < 0.04 + 0.03 for gap in gaps), gaps  # capped (with room for a busy machine)
    assert sum(gaps) >= (0.01 + 0.02 + 0.04 * 4) / 2 - 0.01

    client.fail(1)
    watch.restart()  # a newer kubelet.sock: the grown delay starts again from the shortest
    await eventually(lambda: registrar.registered and len(client.succeeded) == 2, within=1.0)
    assert client.calls[-1].at - client.calls[-2].at < 0.02 + 0.03


async def test_a_kubelet_restart_during_the_backoff_registers_at_once(
    registrar: KubeletRegistrar,
    client: FakeRegisterClient,
    watch: FakeSocketWatch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubelet_registrar, "BACKOFF_INITIAL", 60.0)
    client.fail(1)
    registrar.start()
    await eventually(lambda: [c.outcome for c in client.calls] == ["failed"])
    await settle()
    assert not registrar.registered

    watch.restart()
    await eventually(lambda: registrar.registered, within=1.0, what="registered long before the backoff")
    assert [c.outcome for c in client.calls] == ["failed", "ok"]


async def test_other_changes_in_the_dir_do_not_cut_the_backoff_short(
    registrar: KubeletRegistrar,
    client: FakeRegisterClient,
    watch: FakeSocketWatch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubelet_registrar, "BACKOFF_INITIAL", 60.0)
    client.fail(1)
    registrar.start()
    await eventually(lambda: [c.outcome for c in client.calls] == ["failed"])
    for _ in range(20):  # the kubelet rewriting its checkpoint, other plugins' sockets
        watch.refresh()
        await settle()
    assert [c.outcome for c in client.calls] == ["failed"], "retried without waiting out the backoff"
    assert not registrar.registered


async def test_socket_gone_at_start_is_served_again_before_registering(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint
) -> None:
    endpoint.socket.is_gone = True
    registrar.start()
    await eventually(lambda: registrar.registered)
    await settle()

    assert endpoint.timeline == ["serve_again", "register"]
    assert endpoint.socket.binds == 1
    assert reasons(registrar) == {"socket removed": 1}


async def test_socket_removed_while_registered_is_served_again_and_registered_again(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)

    endpoint.socket.is_gone = True
    watch.refresh()  # the watch sees the dir change; kubelet.sock is the same file
    await eventually(lambda: endpoint.serve_again_calls == 1, within=1.0)
    # serving again ends the kubelet's stream (on purpose, so not "lost"): without a new Register
    # the kubelet never comes back to the new socket
    await eventually(
        lambda: len(client.succeeded) == 2, within=1.0, what="a Register after serving the socket again"
    )
    assert endpoint.timeline == ["register", "serve_again", "register"]
    assert reasons(registrar) == {"start": 1, "socket removed": 1}
    await eventually(lambda: registrar.registered)


async def test_a_change_named_for_another_file_does_not_look_at_our_socket(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, watch: FakeSocketWatch
) -> None:
    """With 100 resources a kubelet restart changes 100 sockets: each registrar looks at its own
    socket only when the change names it (or names nothing), not 100 times."""
    looked: list[str] = []
    gone = endpoint.socket.gone
    endpoint.socket.gone = lambda: looked.append("gone") or gone()  # type: ignore[method-assign]
    registrar.start()
    await eventually(lambda: registrar.registered)
    looked.clear()

    endpoint.socket.is_gone = True
    watch.refresh("devicehost-other.com_thing-abc.sock")
    await settle()
    assert looked == []
    assert endpoint.serve_again_calls == 0

    watch.refresh(endpoint.socket.name)
    await eventually(lambda: endpoint.serve_again_calls == 1, within=1.0)
    await eventually(lambda: registrar.registered)


async def test_a_removed_socket_file_is_served_again_before_registering(
    short_tmp: Path, watch: FakeSocketWatch
) -> None:
    """The same with a real ServedSocket: the file is gone, and serving binds a new one."""
    socket = ServedSocket(RESOURCE, short_tmp, "t1", 0o600)
    endpoint = FakeEndpoint(socket)
    servers: list[grpc.aio.Server] = []

    async def serve() -> None:
        if servers:
            await servers[-1].stop(None)
        socket.remove()
        server = grpc.aio.server()
        socket.bind(server)
        await server.start()
        servers.append(server)

    endpoint.on_serve_again = serve
    await serve()
    os.unlink(socket.path)
    assert socket.gone()

    client = FakeRegisterClient()
    client.stream_to = endpoint
    client.on_call = lambda call: endpoint.timeline.append(f"register {socket.gone()}")
    registrar = KubeletRegistrar(endpoint, watch, client)
    endpoint.registrar = registrar
    registrar.start()
    try:
        await eventually(lambda: registrar.registered)
        assert endpoint.timeline == ["serve_again", "register False"]
        assert stat.S_ISSOCK(socket.path.lstat().st_mode)
        assert not socket.gone()
        assert client.calls[0].endpoint == socket.name
        assert reasons(registrar) == {"socket removed": 1}
    finally:
        await registrar.stop()
        await endpoint.streams.end_all()
        for server in servers:
            await server.stop(None)
        socket.remove()


async def test_registered_needs_the_current_generation_kubelet_sock_and_a_stream(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    client.stream_to = None  # this kubelet answers Register but opens no stream
    registrar.start()
    await eventually(lambda: len(client.succeeded) == 1)
    await settle()
    assert not registrar.registered  # no stream

    stream = KubeletStream(endpoint.streams, endpoint.table)
    await stream.opened.wait()
    assert registrar.registered

    inode = watch.inode
    watch.inode = None  # not told to subscribers: only the property is read
    assert not registrar.registered
    watch.inode = inode
    assert registrar.registered

    watch.generation += 1
    assert not registrar.registered
    watch.generation -= 1
    assert registrar.registered

    stream.drop()
    await stream.task
    assert endpoint.streams.count == 0
    assert not registrar.registered


async def test_stop_cancels_a_register_in_flight_and_unsubscribes(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    client.block()
    with structlog.testing.capture_logs() as logs:
        registrar.start()
        await eventually(lambda: len(client.calls) == 1)
        assert len(watch.subscribers) == 1

        async with asyncio.timeout(1.0):
            await registrar.stop()

    assert watch.subscribers == set()
    assert client.calls[0].outcome == "cancelled"
    assert registrar.stats.count == 0
    assert not registrar.registered
    assert not [e for e in logs if e["log_level"] == "error"]

    watch.restart()
    registrar.stream_lost(endpoint.streams.epoch)
    await settle()
    assert len(client.calls) == 1


async def test_stop_before_start_is_harmless(registrar: KubeletRegistrar, watch: FakeSocketWatch) -> None:
    await registrar.stop()
    assert watch.subscribers == set()


async def test_a_failure_in_the_loop_is_logged_and_the_loop_starts_again(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint.socket.is_gone = True
    failures = [RuntimeError("bind failed")]

    async def serve() -> None:
        if failures:
            raise failures.pop()
        endpoint.socket.bind_again()

    endpoint.on_serve_again = serve
    with structlog.testing.capture_logs() as logs:
        registrar.start()
        await eventually(lambda: registrar.registered)

    assert endpoint.serve_again_calls == 2
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "the re-register loop failed; starting it again"
    ]
    assert registrar.stats.count == 1


async def test_stats_count_every_registration_by_reason_and_time_the_last(
    registrar: KubeletRegistrar, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    registrar.start()
    await eventually(lambda: registrar.registered)
    watch.restart()
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    client.streams[-1].drop()
    await eventually(lambda: len(client.succeeded) == 3 and registrar.registered)

    gate = client.block()
    asyncio.get_running_loop().call_later(0.05, gate.set)
    started = time.monotonic()
    watch.restart()
    await eventually(lambda: len(client.succeeded) == 4 and registrar.registered)
    took = time.monotonic() - started

    stats = registrar.stats
    assert stats.reasons == {"start": 1, "kubelet restarted": 2, "stream lost": 1}
    assert stats.count == 4
    assert stats.last_seconds is not None
    assert 0.045 <= stats.last_seconds <= took


def test_registration_stats_record() -> None:
    stats = RegistrationStats()
    assert (stats.count, stats.last_seconds, dict(stats.reasons)) == (0, None, {})

    stats.record("start", 0.5)
    stats.record("stream lost", 0.25)
    stats.record("stream lost", 0.125)

    assert stats.reasons == {"start": 1, "stream lost": 2}
    assert stats.count == 3
    assert stats.last_seconds == 0.125


async def test_registration_makes_kubelet_registrars_and_serves_nothing_extra(
    tmp_path: Path, endpoint: FakeEndpoint, watch: FakeSocketWatch, client: FakeRegisterClient
) -> None:
    registration = KubeletRegistration(tmp_path, watch, client)
    registrar = registration.registrar(endpoint)
    assert isinstance(registrar, KubeletRegistrar)

    server = RecordingServer()
    registrar.prepare(server)  # type: ignore[arg-type]
    assert (server.handlers, server.generic) == ({}, [])

    endpoint.registrar = registrar
    registrar.start()
    try:
        await eventually(lambda: registrar.registered)
        assert client.calls[0].resource == RESOURCE
    finally:
        await registrar.stop()
        await endpoint.streams.end_all()


# a kubelet restart ends every stream first: not a fault (issue 26)


async def test_a_restart_that_ends_the_stream_and_removes_our_socket_is_no_stream_lost_soon(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    """As the kubelet restarts: its streams end, the dir is cleaned (our socket too), a new
    kubelet.sock. Serving again used to make the lost stream look like one of the same kubelet."""
    registrar.start()
    await eventually(lambda: registrar.registered)
    with structlog.testing.capture_logs() as logs:
        client.streams[0].drop()
        endpoint.socket.is_gone = True
        watch.vanish()
        await eventually(lambda: watch.waiting == 1, what="waiting for kubelet.sock")
        watch.appear()
        await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
        await settle()

    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert reasons(registrar) == {"start": 1, "kubelet restarted": 1}
    assert registrar.stats.failed_tries == 0


async def test_a_new_kubelet_sock_during_the_wait_after_a_lost_stream_makes_it_a_restart(
    registrar: KubeletRegistrar,
    client: FakeRegisterClient,
    watch: FakeSocketWatch,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream ends while kubelet.sock is still the old file (a kubelet that died): the wait
    is cut short by the new kubelet.sock, and nothing calls the restart a fault."""
    monkeypatch.setattr(kubelet_registrar, "BACKOFF_INITIAL", 60.0)  # the wait lasts until the restart
    registrar.start()
    await eventually(lambda: registrar.registered)
    with structlog.testing.capture_logs() as logs:
        client.streams[0].drop()
        await eventually(
            lambda: not registrar.registered and endpoint_waits(registrar), what="the backoff wait"
        )
        watch.restart()
        await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
        await settle()

    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert reasons(registrar) == {"start": 1, "kubelet restarted": 1}
    assert registrar.stats.failed_tries == 0


def endpoint_waits(registrar: KubeletRegistrar) -> bool:
    """The registrar is waiting out a backoff after a lost stream."""
    return registrar._lost_soon is not None


async def test_a_register_failed_against_a_replaced_kubelet_sock_is_retried_at_once_and_not_told(
    registrar: KubeletRegistrar, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    gate = client.block()
    client.fail(1)
    with structlog.testing.capture_logs() as logs:
        registrar.start()
        await eventually(lambda: len(client.calls) == 1)
        watch.restart()  # the kubelet the Register went to is gone; its failure says nothing of the new one
        client.gate = None
        gate.set()
        await eventually(lambda: len(client.succeeded) == 1 and registrar.registered)

    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert registrar.stats.failed_tries == 0
    assert len(client.calls) == 2


async def test_a_socket_removed_while_kubelet_sock_is_absent_is_served_again_before_it_returns(
    registrar: KubeletRegistrar, endpoint: FakeEndpoint, client: FakeRegisterClient, watch: FakeSocketWatch
) -> None:
    """A starting kubelet cleans the dir, then listens: serving again at once, not after the new
    kubelet.sock appears, takes the new socket off the restart's critical path."""
    registrar.start()
    await eventually(lambda: registrar.registered)
    watch.vanish()
    await eventually(lambda: watch.waiting == 1, what="waiting for kubelet.sock")

    endpoint.socket.is_gone = True
    watch.refresh(endpoint.socket.name)
    await eventually(
        lambda: endpoint.serve_again_calls == 1, what="served again while kubelet.sock is absent"
    )
    await eventually(lambda: watch.waiting == 1, what="waiting for kubelet.sock again")
    assert len(client.calls) == 1

    watch.appear()
    await eventually(lambda: len(client.succeeded) == 2 and registrar.registered)
    assert endpoint.timeline == ["register", "serve_again", "register"]
