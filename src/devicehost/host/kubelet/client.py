"""The host's client of the kubelet: ``Register`` calls over ``kubelet.sock``.

:class:`KubeletClient` keeps one channel per ``kubelet.sock`` generation: a channel to a
restarted kubelet's old socket would wait out gRPC's reconnect backoff, a fresh one connects
at once.

A new ``kubelet.sock`` exists before it accepts connections: the kubelet binds the file, then
listens (Go's ``net.Listen``), and a plugin that follows the dir with inotify can be faster
than that. A connect in between is refused, and a gRPC channel that was refused once fails
every call at once until its own reconnect backoff has passed (this is how a restart took
215 ms: three fast failures on that channel while our backoff doubled). So no channel is made
for a socket until a plain ``connect`` to it succeeds, tried again with a short backoff for up
to ``LISTEN_WAIT``; and a channel that fails ``UNAVAILABLE`` is dropped, the next call probes
again and makes a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import structlog

from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
_CHANNEL_OPTIONS = [
    ("grpc.default_authority", "localhost"),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    # Each channel its own connections: a new channel dials /proc/self/fd/N, and N is often the
    # number the retired channel had, so the global pool would hand it the old, failed connection.
    ("grpc.use_local_subchannel_pool", 1),
]
PROBE_INITIAL = 0.001
"""Seconds before connecting again to a ``kubelet.sock`` that refused, growing by half each time
up to ``PROBE_MAX`` (a starting kubelet listens within milliseconds: doubling overshoots that)."""
PROBE_MAX = 0.1
LISTEN_WAIT = 0.5
"""Seconds a Register waits for a refusing ``kubelet.sock`` to listen (within its timeout) before it
fails ``UNAVAILABLE``: far longer than a starting kubelet's bind-to-listen gap, far shorter than a
stale socket left by a kubelet that died."""


class RegisterError(Exception):
    """The kubelet refused or did not answer a Register call."""


@dataclass(eq=False)
class _Socket:
    """One ``kubelet.sock`` file, held open as an ``O_PATH`` descriptor, and its channel."""

    generation: int
    fd: int
    channel: grpc.aio.Channel | None = None
    """Made once a plain connect to the file succeeded."""
    replaced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the socket watch sees a newer ``kubelet.sock``."""
    refusal_logged: bool = False
    probing: asyncio.Lock = field(default_factory=asyncio.Lock)
    probes: int = 0
    """Probes ended (made the channel, or gave up)."""
    refused: RegisterError | None = None
    """Why the last probe gave up."""

    @property
    def address(self) -> str:
        return f"/proc/self/fd/{self.fd}"


class KubeletClient:
    """Register calls to the kubelet, over a channel pinned to one kubelet.sock file.

    The channel dials ``/proc/self/fd/N``, an ``O_PATH`` descriptor of the very kubelet.sock the
    socket watch's current generation names. A channel that dialled the path would reach whatever
    kubelet listens there by the time it connects: after a restart the watch has not told yet,
    the Register would land on the new kubelet while the resource records the old generation,
    and the resource would register a second time once told.

    ``timeout`` gives the seconds a Register may take, read at each call (a reload changes it).
    """

    def __init__(self, watch: KubeletSocketWatch, timeout: Callable[[], float]) -> None:
        self._watch = watch
        self._timeout = timeout
        self._current: _Socket | None = None
        self._closing: set[asyncio.Task[None]] = set()
        watch.subscribe(self._on_dir_change)

    @property
    def timeout(self) -> float:
        """Seconds the next Register may take (the host's live ``register_timeout``)."""
        return self._timeout()

    def _on_dir_change(self, changed: str | None) -> None:
        current = self._current
        if current is not None and self._watch.generation != current.generation:
            current.replaced.set()

    def _socket(self) -> _Socket:
        """The current generation's socket, opened when the generation is new."""
        generation = self._watch.generation
        if self._current is not None and self._current.generation == generation:
            return self._current
        self._retire()
        try:
            fd = os.open(self._watch.kubelet_socket, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise RegisterError(f"kubelet.sock cannot be opened: {exc.strerror}") from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_ctime_ns) != self._watch.identity:
            os.close(fd)
            raise RegisterError("kubelet.sock changed since it was last seen; waiting for the socket watch")
        self._current = _Socket(generation, fd)
        return self._current

    async def _channel(self, sock: _Socket, deadline: float) -> grpc.aio.Channel:
        """``sock``'s channel, made once ``sock`` accepts connections (waiting for it to listen).

        One Register at a time probes (100 resources after a restart are one probe, not 100);
        the others find the channel made, or probe in turn if that one gave up.
        """
        if sock.channel is not None:
            return sock.channel
        probes = sock.probes
        async with sock.probing:
            if sock.channel is None and sock.probes != probes and sock.refused is not None:
                raise RegisterError(str(sock.refused))  # the probe we waited for gave up: so do we, for now
            try:
                return await self._probe(sock, deadline)
            except RegisterError as exc:
                sock.refused = exc
                raise
            finally:
                sock.probes += 1

    async def _probe(self, sock: _Socket, deadline: float) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        started = loop.time()
        give_up = min(deadline, started + LISTEN_WAIT)
        delay = PROBE_INITIAL
        while sock.channel is None:
            if _accepts(sock.address):
                sock.channel = grpc.aio.insecure_channel(f"unix:{sock.address}", options=_CHANNEL_OPTIONS)
                break
            if not sock.refusal_logged:  # once per kubelet.sock, not per try or per resource
                sock.refusal_logged = True
                log.info("kubelet.sock does not accept connections yet; waiting", retry_in=delay)
            remaining = give_up - loop.time()
            if remaining <= 0:
                waited = loop.time() - started
                raise RegisterError(
                    f"UNAVAILABLE: kubelet.sock refused connections for {waited:.3g} s: nothing listens on it"
                )
            if sock.replaced.is_set():
                raise RegisterError("UNAVAILABLE: kubelet.sock was replaced while it refused connections")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(delay, remaining)):
                    await sock.replaced.wait()
            delay = min(1.5 * delay, PROBE_MAX)
        return sock.channel

    def _retire(self, grace: float | None = None) -> None:
        """Close the current socket's channel in the background, then its descriptor."""
        current, self._current = self._current, None
        if current is None:
            return
        current.replaced.set()  # a Register still waiting for it to listen stops waiting
        task = asyncio.get_running_loop().create_task(_close(current.channel, current.fd, grace))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def register(self, resource: str, endpoint: str, options: api_pb2.DevicePluginOptions) -> None:
        """Register ``resource`` served at ``endpoint`` (a file name in the device-plugins dir)."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
        )
        timeout = self.timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        sock = self._socket()
        channel = await self._channel(sock, deadline)
        call = api_pb2_grpc.RegistrationStub(channel).Register(
            request, timeout=max(deadline - loop.time(), 0.001)
        )
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and self._current is sock:
                # the channel may now fail every call until gRPC's own backoff ends: a fresh one
                # (after a probe) next time; calls still on it may finish within their timeout
                self._retire(grace=timeout)
            detail = exc.details() or ""
            raise RegisterError(f"{exc.code().name}: {detail}".rstrip(": ")) from None
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError for an RPC the *server* cancelled (a kubelet going
            # down mid-Register); only a cancel aimed at our own task may propagate.
            task = asyncio.current_task()
            if call.cancelled() and task is not None and not task.cancelling():
                raise RegisterError("CANCELLED: the kubelet cancelled the call") from None
            raise

    async def close(self) -> None:
        self._watch.unsubscribe(self._on_dir_change)
        self._retire()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _accepts(address: str) -> bool:
    """Whether a unix socket at ``address`` accepts a connection now (the connection is closed
    at once: the kubelet's gRPC server drops a connection that ends before its preface quietly)."""
    with socket.socket(
        socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    ) as probe:
        try:
            probe.connect(address)
        except (ConnectionRefusedError, BlockingIOError):  # not listening yet; or its backlog is full
            return False
        except OSError as exc:
            raise RegisterError(f"UNAVAILABLE: kubelet.sock cannot be connected to: {exc.strerror}") from None
    return True


async def _close(channel: grpc.aio.Channel | None, fd: int, grace: float | None) -> None:
    try:
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close(grace)
    finally:
        os.close(fd)
