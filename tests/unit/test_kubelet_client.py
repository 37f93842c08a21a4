"""KubeletClient against a real grpc.aio server serving v1beta1.Registration on kubelet.sock.

The kubelet here is a small servicer on a real unix socket in a temp dir under /tmp, and the
socket watch is a real KubeletSocketWatch over that dir (told with ``refresh()``, or running as
a task). Open descriptors are read from /proc/self/fd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from waiting import WITHIN, eventually

from devicehost.host.kubelet.client import API_VERSION, KubeletClient, RegisterError
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.registration import KubeletSocket

RESOURCE = "example.com/widget"
ENDPOINT = "devicehost-example.com_widget-abc123.sock"
OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
TIMEOUT = 30.0
"""The client's Register timeout where the test is not about the timeout: far above any wait here."""
QUICK = 3.0
"""How long a Register that cannot reach a kubelet may take to fail (it must not wait out TIMEOUT)."""


def open_fds() -> dict[int, str]:
    """This process's descriptors and what each one names."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return fds


def fds_in(directory: Path) -> list[str]:
    """What the descriptors open on files in ``directory`` name (an unlinked one ends ' (deleted)')."""
    prefix = f"{directory}/"
    return sorted(target for target in open_fds().values() if target.startswith(prefix))


class Registrar(api_pb2_grpc.RegistrationServicer):
    """The kubelet's Registration service: records each request; may abort, or never answer."""

    def __init__(self, abort: tuple[grpc.StatusCode, str] | None = None, hang: bool = False) -> None:
        self.requests: list[api_pb2.RegisterRequest] = []
        self.abort = abort
        self.hang = hang
        self.received = asyncio.Event()
        self.server: grpc.aio.Server | None = None

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        self.requests.append(request)
        self.received.set()
        if self.abort is not None:
            await context.abort(*self.abort)
        if self.hang:
            await asyncio.Event().wait()
        return api_pb2.Empty()


class Kubelet:
    """Registration servers on socket files in the device-plugins dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "kubelet.sock"
        self._servers: list[grpc.aio.Server] = []

    async def start(self, registrar: Registrar | None = None, name: str = "kubelet.sock") -> Registrar:
        """Serve ``registrar`` (a fresh one by default) on a new socket file ``name``."""
        registrar = registrar or Registrar()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(registrar, server)
        assert server.add_insecure_port(f"unix:{self.directory / name}")
        await server.start()
        registrar.server = server
        self._servers.append(server)
        return registrar

    async def stop(self, registrar: Registrar, grace: float | None = None) -> None:
        """Stop serving (grpc removes the socket file)."""
        assert registrar.server is not None
        await registrar.server.stop(grace)

    async def close(self) -> None:
        for server in self._servers:
            await server.stop(None)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[Kubelet]:
    kubelet = Kubelet(plugin_dir)
    yield kubelet
    await kubelet.close()


@pytest.fixture
def watch(plugin_dir: Path) -> KubeletSocketWatch:
    return KubeletSocketWatch(plugin_dir)


@pytest.fixture
async def clients(watch: KubeletSocketWatch) -> AsyncIterator[Callable[[float], KubeletClient]]:
    """Makes clients over ``watch`` with a given timeout; closes them afterwards."""
    made: list[KubeletClient] = []

    def make(timeout: float = TIMEOUT) -> KubeletClient:
        client = KubeletClient(watch, lambda: timeout)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def client(clients: Callable[[float], KubeletClient]) -> KubeletClient:
    return clients(TIMEOUT)


def register(client: KubeletClient) -> Awaitable[None]:
    return client.register(RESOURCE, ENDPOINT, OPTIONS)


async def timed_register_error(client: KubeletClient) -> tuple[str, float]:
    """The RegisterError a Register ends in, and how long it took."""
    started = time.monotonic()
    with pytest.raises(RegisterError) as caught:
        await asyncio.wait_for(register(client), TIMEOUT + WITHIN)
    return str(caught.value), time.monotonic() - started


# what is sent


async def test_register_sends_version_endpoint_resource_and_options(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    registrar = await kubelet.start()
    watch.refresh()

    await register(client)

    assert len(registrar.requests) == 1
    request = registrar.requests[0]
    assert request.version == API_VERSION == "v1beta1"
    assert request.endpoint == ENDPOINT
    assert request.resource_name == RESOURCE
    assert request.options == OPTIONS
    assert request.options.pre_start_required
    assert request.options.get_preferred_allocation_available


async def test_registers_in_one_generation_share_one_channel(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    registrar = await kubelet.start()
    watch.refresh()

    await register(client)
    await client.register("example.com/other", "other.sock", api_pb2.DevicePluginOptions())
    await register(client)

    assert [r.resource_name for r in registrar.requests] == [RESOURCE, "example.com/other", RESOURCE]
    assert registrar.requests[1].endpoint == "other.sock"
    assert registrar.requests[1].options == api_pb2.DevicePluginOptions()
    # one O_PATH descriptor of kubelet.sock: the channel's
    assert fds_in(plugin_dir) == [str(kubelet.path)]


# the kubelet says no


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "unsupported API version v0"),
        (grpc.StatusCode.FAILED_PRECONDITION, "resource example.com/widget is already registered"),
        (grpc.StatusCode.UNKNOWN, "cannot dial the plugin"),
    ],
)
async def test_an_abort_is_a_register_error_with_code_and_details(
    kubelet: Kubelet,
    watch: KubeletSocketWatch,
    client: KubeletClient,
    code: grpc.StatusCode,
    details: str,
) -> None:
    registrar = await kubelet.start(Registrar(abort=(code, details)))
    watch.refresh()

    with pytest.raises(RegisterError) as caught:
        await register(client)

    assert str(caught.value) == f"{code.name}: {details}"
    assert len(registrar.requests) == 1


async def test_an_abort_without_details_is_the_code_alone(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    await kubelet.start(Registrar(abort=(grpc.StatusCode.PERMISSION_DENIED, "")))
    watch.refresh()

    with pytest.raises(RegisterError) as caught:
        await register(client)

    assert str(caught.value) == "PERMISSION_DENIED"


async def test_a_server_without_the_registration_service_is_unimplemented(
    watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    server = grpc.aio.server()
    assert server.add_insecure_port(f"unix:{plugin_dir / 'kubelet.sock'}")
    await server.start()
    try:
        watch.refresh()
        with pytest.raises(RegisterError, match=r"^UNIMPLEMENTED\b"):
            await register(client)
    finally:
        await server.stop(None)


async def test_after_an_error_the_next_register_succeeds(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    registrar = await kubelet.start(Registrar(abort=(grpc.StatusCode.UNAVAILABLE, "not ready")))
    watch.refresh()
    with pytest.raises(RegisterError, match=r"^UNAVAILABLE: not ready$"):
        await register(client)

    registrar.abort = None
    await register(client)

    assert len(registrar.requests) == 2


# no kubelet to reach


async def test_no_kubelet_sock_is_a_register_error_at_once(
    watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    assert watch.inode is None

    message, took = await timed_register_error(client)

    assert message == "kubelet.sock cannot be opened: No such file or directory"
    assert took < QUICK
    assert fds_in(plugin_dir) == []


async def test_a_kubelet_sock_nobody_listens_on_fails_quickly(
    watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(plugin_dir / "kubelet.sock"))
    stale.close()  # the file stays; connecting to it is refused
    watch.refresh()
    assert watch.inode is not None

    message, took = await timed_register_error(client)

    assert message.startswith("UNAVAILABLE")
    assert took < QUICK, f"took {took:.2f} s with a {TIMEOUT} s timeout"


async def test_a_stopped_kubelet_fails_quickly(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    registrar = await kubelet.start()
    watch.refresh()
    await register(client)

    await kubelet.stop(registrar)  # gone, and its file with it; the watch has not looked yet
    message, took = await timed_register_error(client)

    assert message.startswith("UNAVAILABLE")
    assert took < QUICK, f"took {took:.2f} s with a {TIMEOUT} s timeout"
    assert len(registrar.requests) == 1


async def test_a_kubelet_sock_changed_since_the_watch_looked_is_refused(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old.bind(os.fspath(kubelet.path))
        watch.refresh()
        seen = watch.generation
        kubelet.path.unlink()  # ``old`` stays bound: its inode cannot be reused
        registrar = await kubelet.start()  # a new file the watch has not been told of

        with pytest.raises(RegisterError, match=r"^kubelet\.sock changed since it was last seen"):
            await register(client)

        assert registrar.requests == []
        assert fds_in(plugin_dir) == []  # the descriptor opened to check is closed again

        watch.refresh()
        assert watch.generation == seen + 1
        await register(client)
        assert len(registrar.requests) == 1
    finally:
        old.close()


# a new kubelet.sock generation


async def test_a_new_generation_reaches_the_restarted_kubelet(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    first = await kubelet.start()
    watch.refresh()
    await register(client)
    assert len(first.requests) == 1

    await kubelet.stop(first)
    second = await kubelet.start()
    watch.refresh()
    await register(client)

    assert len(first.requests) == 1
    assert len(second.requests) == 1
    # the old channel and its descriptor are retired: only the new file is held
    await eventually(lambda: fds_in(plugin_dir) == [str(kubelet.path)], "the old descriptor is closed")


async def test_a_new_generation_seen_by_the_running_watch_reaches_the_restarted_kubelet(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    first = await kubelet.start()
    watch_task = asyncio.create_task(watch.run())
    try:
        await eventually(lambda: watch.inode is not None, "the watch sees kubelet.sock")
        await register(client)
        generation = watch.generation

        await kubelet.stop(first)
        second = await kubelet.start()
        inode = os.lstat(kubelet.path).st_ino
        await eventually(
            lambda: watch.generation > generation and watch.identity == _identity(kubelet.path),
            "the watch sees the new kubelet.sock",
        )
        assert watch.inode == inode
        await register(client)

        assert len(first.requests) == 1
        assert len(second.requests) == 1
    finally:
        watch_task.cancel()
        await asyncio.wait({watch_task}, timeout=WITHIN)
        assert watch_task.cancelled()


async def test_a_reused_descriptor_number_does_not_inherit_a_failed_connection(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    """A kubelet restart: the Register on the new generation's fresh channel must connect at once.

    The new channel dials ``unix:/proc/self/fd/N`` with the same N as the retired one (the number
    is free again), and gRPC's global subchannel pool hands it the retired channel's subchannel,
    still in reconnect backoff after "Connection refused" while anything holds the old call (here
    the caught error; in the host, uncollected reference cycles do the same, about 1 time in 3).
    """
    first = await kubelet.start()
    watch.refresh()
    await register(client)
    old_fds = fds_in(plugin_dir)
    await kubelet.stop(first)
    with pytest.raises(RegisterError, match=r"^UNAVAILABLE\b") as down:  # the kubelet is down, not yet seen
        await register(client)
    watch.refresh()  # kubelet.sock gone: a new generation, the channel is retired
    with pytest.raises(RegisterError, match="cannot be opened"):
        await register(client)
    await eventually(lambda: fds_in(plugin_dir) == [], "the retired channel's descriptor is closed")

    second = await kubelet.start()
    watch.refresh()
    await register(client)  # fails here: UNAVAILABLE ... unix:/proc/self/fd/N ... Connection refused

    assert len(second.requests) == 1
    assert old_fds == [f"{kubelet.path}"]
    assert down.value is not None


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


async def test_the_channel_dials_the_file_of_its_generation_not_the_path(
    kubelet: Kubelet,
    watch: KubeletSocketWatch,
    client: KubeletClient,
    plugin_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kubelet.sock replaced between the client opening it and the channel connecting."""
    first = await kubelet.start()
    second = await kubelet.start(name="next.sock")
    watch.refresh()
    real_fstat = os.fstat
    swapped = False

    def fstat_then_swap(fd: int) -> os.stat_result:
        nonlocal swapped
        st = real_fstat(fd)
        if not swapped and os.readlink(f"/proc/self/fd/{fd}") == str(kubelet.path):
            swapped = True
            os.rename(kubelet.path, plugin_dir / "old.sock")  # the first kubelet still listens there
            os.rename(plugin_dir / "next.sock", kubelet.path)
        return st

    monkeypatch.setattr(os, "fstat", fstat_then_swap)
    await register(client)
    monkeypatch.setattr(os, "fstat", real_fstat)

    assert swapped
    assert len(first.requests) == 1  # the file the watch named, not whatever is at the path now
    assert second.requests == []

    watch.refresh()  # now the watch sees the new file: a new generation, a new channel
    await register(client)

    assert len(first.requests) == 1
    assert len(second.requests) == 1


# the timeout and cancellation


async def in_flight(registrar: Registrar, task: asyncio.Task[None]) -> None:
    """Wait until the Register of ``task`` is with the kubelet (and fail if it ended first)."""
    await eventually(lambda: registrar.received.is_set() or task.done(), "the Register reaches the kubelet")
    assert not task.done(), f"the Register ended before it reached the kubelet: {task}"


async def test_a_kubelet_that_never_answers_is_deadline_exceeded(
    kubelet: Kubelet, watch: KubeletSocketWatch, clients: Callable[[float], KubeletClient]
) -> None:
    registrar = await kubelet.start(Registrar(hang=True))
    watch.refresh()
    client = clients(0.5)

    message, took = await timed_register_error(client)

    assert message.startswith("DEADLINE_EXCEEDED")
    assert len(registrar.requests) == 1
    assert 0.4 <= took < 0.5 + WITHIN


async def test_cancelling_the_caller_cancels_the_register(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    registrar = await kubelet.start(Registrar(hang=True))
    watch.refresh()
    task = asyncio.create_task(register(client))
    await in_flight(registrar, task)

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WITHIN)
    assert task.cancelled()  # a cancel aimed at the caller is never turned into a RegisterError


async def test_a_kubelet_going_down_mid_register_is_a_register_error(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient
) -> None:
    registrar = await kubelet.start(Registrar(hang=True))
    watch.refresh()
    task = asyncio.create_task(register(client))
    await in_flight(registrar, task)

    await kubelet.stop(registrar, grace=0)

    with pytest.raises(RegisterError, match=r"^(UNAVAILABLE|CANCELLED)\b"):
        await asyncio.wait_for(task, WITHIN)


# close()


async def test_close_leaves_no_descriptor_behind(
    kubelet: Kubelet, watch: KubeletSocketWatch, clients: Callable[[float], KubeletClient], plugin_dir: Path
) -> None:
    await kubelet.start()
    watch.refresh()
    warm = clients(TIMEOUT)  # gRPC opens some process-wide descriptors on first use: open them now
    await register(warm)
    await warm.close()
    await eventually(lambda: fds_in(plugin_dir) == [], "the warm-up client's descriptor is closed")
    before = open_fds()

    client = clients(TIMEOUT)
    await register(client)
    assert fds_in(plugin_dir) == [str(kubelet.path)]
    await client.close()

    assert fds_in(plugin_dir) == []  # the O_PATH descriptor is closed by the time close() returns
    # and the connection's socket goes too (the server closes its end on its own time)
    # (descriptors of earlier tests may close meanwhile: only new ones count)
    await eventually(lambda: open_fds().items() <= before.items(), "no descriptor is left open")


async def test_close_also_closes_the_channels_of_earlier_generations(
    kubelet: Kubelet, watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    for _ in range(3):
        registrar = await kubelet.start()
        watch.refresh()
        await register(client)
        await kubelet.stop(registrar)
    assert fds_in(plugin_dir)

    await client.close()

    assert fds_in(plugin_dir) == []


async def test_close_of_an_unused_client_and_a_second_close_are_harmless(
    kubelet: Kubelet, watch: KubeletSocketWatch, clients: Callable[[float], KubeletClient], plugin_dir: Path
) -> None:
    await clients(TIMEOUT).close()

    await kubelet.start()
    watch.refresh()
    client = clients(TIMEOUT)
    await register(client)
    await client.close()
    await client.close()

    assert fds_in(plugin_dir) == []


# a kubelet.sock that exists before it listens (issue 26)


async def test_a_kubelet_sock_that_listens_late_gets_its_register_once_it_listens(
    watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    """The kubelet binds kubelet.sock, then listens: a Register in between used to fail
    UNAVAILABLE (connection refused), and the channel then failed every call until gRPC's own
    reconnect backoff ended. Now no Register goes out before the socket accepts."""
    seen: list[str] = []

    async def record(request: api_pb2.RegisterRequest) -> None:
        seen.append(request.resource_name)

    late = KubeletSocket(plugin_dir, listen_delay=0.3)
    serving = asyncio.create_task(late.serve(record))
    try:
        await eventually(lambda: late.path.exists(), what="kubelet.sock bound")
        watch.refresh()
        assert not serving.done(), "still bound only: connections are refused"

        await asyncio.wait_for(register(client), QUICK)

        assert serving.done()
        assert seen == [RESOURCE]
    finally:
        await serving
        await late.stop()
        late.release_old_inode()


async def test_a_refusing_kubelet_sock_replaced_meanwhile_ends_the_wait(
    watch: KubeletSocketWatch, client: KubeletClient, plugin_dir: Path
) -> None:
    path = os.fspath(plugin_dir / "kubelet.sock")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(path)  # not listening (yet)
    watch.refresh()
    waiting = asyncio.create_task(register(client))
    try:
        await asyncio.sleep(0.05)
        assert not waiting.done(), "a refusing kubelet.sock is waited for, not failed at once"

        bound.close()
        os.unlink(path)
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound.bind(path)  # the next kubelet's file
        watch.refresh()

        with pytest.raises(RegisterError, match="replaced"):
            await asyncio.wait_for(waiting, QUICK)
    finally:
        waiting.cancel()
        bound.close()


async def test_the_timeout_is_read_at_each_call(kubelet: Kubelet, watch: KubeletSocketWatch) -> None:
    """A reloaded register_timeout applies to the next Register."""
    timeout = [TIMEOUT]
    client = KubeletClient(watch, lambda: timeout[0])
    try:
        await kubelet.start(Registrar(hang=True))
        watch.refresh()
        timeout[0] = 0.2

        message, took = await timed_register_error(client)

        assert message.startswith("DEADLINE_EXCEEDED")
        assert took < QUICK
    finally:
        await client.close()
