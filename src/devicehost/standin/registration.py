"""``kubelet.sock``: the device-plugins dir, the socket's lifecycle and its Registration service.

Each start cleans the dir as the kubelet does (everything but the checkpoint and directories
goes) and serves a socket with a new inode, in the kubelet's order: the socket file is bound
first, and connections to it are refused until it listens (Go's ``net.Listen`` is ``bind`` then
``listen``; on a busy node the kubelet can be scheduled out between the two). The stand-in
holds that window open for ``listen_delay`` seconds so that a plugin which registers the moment
``kubelet.sock`` appears meets the refusal every time, not once in a thousand restarts. :func:`register_problem` holds the checks the
kubelet makes before it dials a plugin back; a Register handler knows which start it belongs to
through :func:`handler_epoch`, because a real kubelet's handler dies with the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from devicehost.hookspecs.rules import resource_name_problem
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.model import VERSION

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
LISTEN_DELAY = 0.005
"""Seconds between binding ``kubelet.sock`` and listening on it (connections are refused meanwhile)."""
_BACKLOG = 128
_CHUNK = 65536

Register = Callable[[api_pb2.RegisterRequest], Awaitable[str | None]]
"""Handles one Register request: ``None`` when it succeeded, else the kubelet's error text."""

_handler_epoch: contextvars.ContextVar[int] = contextvars.ContextVar("kubelet_handler_epoch")
"""Which start of the stand-in a Register handler belongs to."""


def handler_epoch(default: int) -> int:
    """The start the running Register handler belongs to; ``default`` outside a handler."""
    return _handler_epoch.get(default)


def register_problem(request: api_pb2.RegisterRequest) -> str | None:
    """Why the kubelet refuses a Register request before dialling back (its text), or ``None``."""
    if request.version != VERSION:
        return (
            f'requested API version "{request.version}" is not supported by kubelet. '
            f'Supported versions are ["{VERSION}"]'
        )
    if resource_name_problem(request.resource_name):
        return f'the ResourceName "{request.resource_name}" is invalid'
    return None


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    """``v1beta1.Registration`` for one start: marks its handlers with ``epoch``, then asks ``register``."""

    def __init__(self, register: Register, epoch: int) -> None:
        self._register = register
        self._epoch = epoch

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.Empty:
        _handler_epoch.set(self._epoch)
        error = await self._register(request)
        if error:
            # A plain Go error from the kubelet's handler reaches the plugin as UNKNOWN.
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()


class KubeletSocket:
    """The device-plugins dir and the ``kubelet.sock`` served in it.

    The Registration service itself is a grpc.aio server on a private abstract socket; the
    stand-in binds ``kubelet.sock`` itself (gRPC binds and listens in one step, so it cannot
    leave the kubelet's refusal window open), listens after ``listen_delay``, and joins each
    connection it accepts to the gRPC server byte for byte.
    """

    def __init__(self, directory: Path, listen_delay: float = LISTEN_DELAY) -> None:
        self.directory = directory
        self.path = directory / KUBELET_SOCKET
        self.listen_delay = listen_delay
        self.epoch = 0
        """How many times the socket was served: which start of the kubelet this is."""
        self.created_at: float | None = None
        """``time.monotonic()`` when this start's ``kubelet.sock`` file appeared (was bound)."""
        self._server: grpc.aio.Server | None = None
        self._listener: socket.socket | None = None
        self._listener_file: tuple[int, int] | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._joins: set[asyncio.Task[None]] = set()
        self._old_inode_fd: int | None = None

    def clean_dir(self) -> None:
        """Create the dir, and remove every file and link in it but the checkpoint."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT and (entry.is_symlink() or not entry.is_dir()):
                entry.unlink()

    async def serve(self, register: Register) -> None:
        """Serve Registration with ``register`` on a new socket, then let go of the old inode.

        Returns once ``kubelet.sock`` accepts connections; it exists ``listen_delay`` before.
        """
        self.epoch += 1
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(RegistrationServicer(register, self.epoch), server)
        private = f"devicehost-standin-{os.getpid()}-{id(self):x}-{self.epoch}"
        if not server.add_insecure_port(f"unix-abstract:{private}"):
            raise OSError(f"cannot serve the stand-in's Registration on @{private}")
        await server.start()
        self._server = server
        listener = socket.socket(
            socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
        )
        try:
            listener.bind(str(self.path))  # the file appears here; connecting is refused until listen()
        except OSError:
            listener.close()
            raise
        self.created_at = time.monotonic()
        st = self.path.lstat()
        self._listener, self._listener_file = listener, (st.st_dev, st.st_ino)
        self.release_old_inode()
        if self.listen_delay > 0:
            await asyncio.sleep(self.listen_delay)
        listener.listen(_BACKLOG)
        self._accepting = asyncio.create_task(self._accept(listener, "\0" + private), name="kubelet.sock")

    async def stop(self) -> None:
        """Stop serving, remove ``kubelet.sock`` and close every connection to it; the socket's
        inode is held until the next socket exists.

        Plugins may tell a kubelet restart by the inode number alone, so the number must not be
        reused by the next socket.
        """
        if self._old_inode_fd is None and self.path.exists():
            self._old_inode_fd = os.open(self.path, os.O_PATH)
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                st = self.path.lstat()
                if (st.st_dev, st.st_ino) == self._listener_file:
                    self.path.unlink()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        for join in list(self._joins):
            join.cancel()
        await asyncio.gather(*self._joins, return_exceptions=True)

    def in_current_handler(self) -> bool:
        """False inside a Register handler of an earlier start: the kubelet restarted under it."""
        return handler_epoch(self.epoch) == self.epoch

    def release_old_inode(self) -> None:
        """Close the fd that holds the previous socket's inode (when stopping for good)."""
        if self._old_inode_fd is not None:
            os.close(self._old_inode_fd)
            self._old_inode_fd = None

    async def _accept(self, listener: socket.socket, private: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            join = loop.create_task(_join(conn, private), name="kubelet.sock connection")
            self._joins.add(join)
            join.add_done_callback(self._joins.discard)


async def _join(conn: socket.socket, private: str) -> None:
    """Carry one accepted connection to the gRPC server and back, until either side ends it."""
    loop = asyncio.get_running_loop()
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        conn.setblocking(False)
        await loop.sock_connect(upstream, private)
        await asyncio.gather(_copy(conn, upstream), _copy(upstream, conn))
    finally:
        conn.close()
        upstream.close()


async def _copy(source: socket.socket, sink: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        while data := await loop.sock_recv(source, _CHUNK):
            await loop.sock_sendall(sink, data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
