"""``kubelet.sock``: the device-plugins dir, the socket's lifecycle and its Registration service.

Each start cleans the dir as the kubelet does (everything but the checkpoint and directories
goes) and serves a socket with a new inode. :func:`register_problem` holds the checks the
kubelet makes before it dials a plugin back; a Register handler knows which start it belongs to
through :func:`handler_epoch`, because a real kubelet's handler dies with the kubelet.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from devicehost.hookspecs.rules import resource_name_problem
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.model import VERSION

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"

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
    """The device-plugins dir and the ``kubelet.sock`` served in it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / KUBELET_SOCKET
        self.epoch = 0
        """How many times the socket was served: which start of the kubelet this is."""
        self._server: grpc.aio.Server | None = None
        self._old_inode_fd: int | None = None

    def clean_dir(self) -> None:
        """Create the dir, and remove every file and link in it but the checkpoint."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT and (entry.is_symlink() or not entry.is_dir()):
                entry.unlink()

    async def serve(self, register: Register) -> None:
        """Serve Registration with ``register`` on a new socket, then let go of the old inode."""
        self.epoch += 1
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(RegistrationServicer(register, self.epoch), server)
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self._server = server
        self.release_old_inode()

    async def stop(self) -> None:
        """Stop serving; the socket's inode is held until the next socket exists.

        Plugins may tell a kubelet restart by the inode number alone, so the number must not be
        reused by the next socket.
        """
        if self._old_inode_fd is None and self.path.exists():
            self._old_inode_fd = os.open(self.path, os.O_PATH)
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    def in_current_handler(self) -> bool:
        """False inside a Register handler of an earlier start: the kubelet restarted under it."""
        return handler_epoch(self.epoch) == self.epoch

    def release_old_inode(self) -> None:
        """Close the fd that holds the previous socket's inode (when stopping for good)."""
        if self._old_inode_fd is not None:
            os.close(self._old_inode_fd)
            self._old_inode_fd = None
