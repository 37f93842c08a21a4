"""The host's client of the kubelet: ``Register`` calls over ``kubelet.sock``.

:class:`KubeletClient` keeps one channel per ``kubelet.sock`` generation: a channel to a
restarted kubelet's old socket would wait out gRPC's reconnect backoff, a fresh one connects
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import grpc

from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

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


class RegisterError(Exception):
    """The kubelet refused or did not answer a Register call."""


class KubeletClient:
    """Register calls to the kubelet, over a channel pinned to one kubelet.sock file.

    The channel dials ``/proc/self/fd/N``, an ``O_PATH`` descriptor of the very kubelet.sock the
    socket watch's current generation names. A channel that dialled the path would reach whatever
    kubelet listens there by the time it connects: after a restart the watch has not told yet,
    the Register would land on the new kubelet while the resource records the old generation,
    and the resource would register a second time once told.
    """

    def __init__(self, watch: KubeletSocketWatch, timeout: float) -> None:
        self._watch = watch
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._channel_fd: int | None = None
        self._channel_generation = -1
        self._closing: set[asyncio.Task[None]] = set()

    def _stub(self) -> api_pb2_grpc.RegistrationAsyncStub:
        generation = self._watch.generation
        if self._channel is None or generation != self._channel_generation:
            self._retire_channel()
            try:
                fd = os.open(self._watch.kubelet_socket, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                raise RegisterError(f"kubelet.sock cannot be opened: {exc.strerror}") from None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_ctime_ns) != self._watch.identity:
                os.close(fd)
                raise RegisterError(
                    "kubelet.sock changed since it was last seen; waiting for the socket watch"
                )
            self._channel = grpc.aio.insecure_channel(f"unix:/proc/self/fd/{fd}", options=_CHANNEL_OPTIONS)
            self._channel_fd = fd
            self._channel_generation = generation
        return api_pb2_grpc.RegistrationStub(self._channel)

    def _retire_channel(self) -> None:
        """Close the current channel in the background, then its descriptor."""
        if self._channel is None:
            return
        task = asyncio.get_running_loop().create_task(_close_channel(self._channel, self._channel_fd))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        self._channel = self._channel_fd = None

    async def register(self, resource: str, endpoint: str, options: api_pb2.DevicePluginOptions) -> None:
        """Register ``resource`` served at ``endpoint`` (a file name in the device-plugins dir)."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
        )
        call = self._stub().Register(request, timeout=self._timeout)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
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
        self._retire_channel()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _close_channel(channel: grpc.aio.Channel, fd: int | None) -> None:
    try:
        with contextlib.suppress(Exception):
            await channel.close(None)
    finally:
        if fd is not None:
            os.close(fd)
