"""The kubelet as the host sees it: ``kubelet.sock`` (which inode, if any) and the Register call.

:class:`KubeletWatcher` follows the device-plugins dir with inotify (and a slow poll as a safety
net for a dir that is deleted and recreated) and tells subscribers when ``kubelet.sock`` gets a
new inode (or is created anew: a new ctime) or a file they own disappears. :class:`KubeletClient` keeps one
channel per ``kubelet.sock`` generation: a channel to a restarted kubelet's old socket would wait
out gRPC's reconnect backoff, a fresh one connects at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from asyncinotify import Inotify, Mask

from devicehost.host.sockets import KUBELET_SOCKET
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
POLL_INTERVAL = 2.0
_WATCH_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF
_CHANNEL_OPTIONS = [
    ("grpc.default_authority", "localhost"),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime in ns) of ``path`` itself, or None when nothing is there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class KubeletWatcher:
    """Follows ``kubelet.sock`` and the files of the device-plugins dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.kubelet_socket = directory / KUBELET_SOCKET
        self._identity: tuple[int, int, int] | None = None
        self._inode: int | None = None
        self._generation = 0
        self._present = asyncio.Event()
        self._subscribers: set[Callable[[], None]] = set()
        self._check()

    @property
    def inode(self) -> int | None:
        """The inode of ``kubelet.sock`` as last seen (None while it is absent)."""
        return self._inode

    @property
    def generation(self) -> int:
        """Bumped whenever the watcher sees a different ``kubelet.sock`` file.

        A file is told by (device, inode, ctime), not by its inode number alone: the filesystem
        can hand a freed inode number straight to the next kubelet.sock. One file is counted
        once, so a late inotify event for a file already seen bumps nothing.
        """
        return self._generation

    @property
    def identity(self) -> tuple[int, int, int] | None:
        """(device, inode, ctime in ns) of the ``kubelet.sock`` of this generation."""
        return self._identity

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) after any change in the dir."""
        self._subscribers.add(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.discard(callback)

    async def wait_present(self) -> int:
        """Wait until ``kubelet.sock`` exists; return its inode."""
        while self.inode is None:
            await self._present.wait()
        return self.inode

    def refresh(self) -> None:
        """Look at the dir again and tell every subscriber."""
        self._check()
        for callback in list(self._subscribers):
            callback()

    def _check(self) -> None:
        identity = file_identity(self.kubelet_socket)
        if identity == self._identity:
            return
        self._identity = identity
        self._inode = None if identity is None else identity[1]
        self._generation += 1
        log.info("kubelet socket changed", present=identity is not None, inode=self._inode)
        if identity is None:
            self._present.clear()
        else:
            self._present.set()

    async def run(self) -> None:
        """Watch until cancelled."""
        while True:
            try:
                with Inotify() as inotify:
                    inotify.add_watch(self.directory, _WATCH_MASK)
                    self.refresh()
                    await self._follow(inotify)
            except OSError as exc:
                log.warning(
                    "cannot watch the device-plugins dir, polling", dir=str(self.directory), error=str(exc)
                )
                self.refresh()
                await asyncio.sleep(POLL_INTERVAL)
            except Exception:  # every resource depends on this task: never let it die
                log.exception("the device-plugins dir watcher failed; watching again")
                await asyncio.sleep(POLL_INTERVAL)

    async def _follow(self, inotify: Inotify) -> None:
        """Refresh on every batch of events, and every POLL_INTERVAL; return if the dir goes."""
        while True:
            try:
                async with asyncio.timeout(POLL_INTERVAL):  # not wait_for: 3.11's can swallow a cancel
                    event = await inotify.get()
            except TimeoutError:
                self.refresh()
                continue
            gone = bool(event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED))
            self.refresh()
            if gone:
                log.warning(
                    "device-plugins dir was removed; waiting for it to come back", dir=str(self.directory)
                )
                return


class RegisterError(Exception):
    """The kubelet refused or did not answer a Register call."""


class KubeletClient:
    """Register calls to the kubelet, over a channel pinned to one kubelet.sock file.

    The channel dials ``/proc/self/fd/N``, an ``O_PATH`` descriptor of the very kubelet.sock the
    watcher's current generation names. A channel that dialled the path would reach whatever
    kubelet listens there by the time it connects: after a restart the watcher has not told yet,
    the Register would land on the new kubelet while the resource records the old generation,
    and the resource would register a second time once told.
    """

    def __init__(self, watcher: KubeletWatcher, timeout: float) -> None:
        self._watcher = watcher
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._channel_fd: int | None = None
        self._channel_generation = -1
        self._closing: set[asyncio.Task[None]] = set()

    def _stub(self) -> api_pb2_grpc.RegistrationAsyncStub:
        generation = self._watcher.generation
        if self._channel is None or generation != self._channel_generation:
            self._retire_channel()
            try:
                fd = os.open(self._watcher.kubelet_socket, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                raise RegisterError(f"kubelet.sock cannot be opened: {exc.strerror}") from None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_ctime_ns) != self._watcher.identity:
                os.close(fd)
                raise RegisterError("kubelet.sock changed since it was last seen; waiting for the watcher")
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
