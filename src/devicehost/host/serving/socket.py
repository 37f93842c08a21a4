"""One resource's socket file: a name no other file holds, bound under the umask, removed only if ours.

The file is created by ``bind()`` inside gRPC's ``add_insecure_port``; the umask gives it its
mode from the start (no chmod race with a kubelet cleaning the dir, nothing to follow). The
inode recorded then is how the host tells its own file from one that replaced it.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import structlog

from devicehost.host.sockets import inode_of, remove_own, socket_name

log = structlog.get_logger(__name__)


class ServedSocket:
    """The socket file of one resource in one directory."""

    def __init__(self, resource: str, directory: Path, token: str, mode: int) -> None:
        self.resource = resource
        self.directory = directory
        self.name = socket_name(resource, token, directory)
        """The file name, relative to ``directory`` (what Register sends as the endpoint)."""
        self._token = token
        self._mode = mode
        self._inode: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / self.name

    def bind(self, server: grpc.aio.Server) -> None:
        """Create the socket file as ``server``'s port, never over a file we did not create."""
        attempt = 0
        while inode_of(self.path) is not None:
            attempt += 1
            taken = self.path
            self.name = socket_name(self.resource, f"{self._token}{attempt}", self.directory)
            log.warning(
                "socket path is taken by a file we did not create",
                resource=self.resource,
                path=str(taken),
                using=str(self.path),
            )
        # The umask is process-wide, so files other threads create meanwhile only get stricter.
        umask = os.umask(0o777 & ~self._mode)
        try:
            server.add_insecure_port(f"unix:{self.path}")
        finally:
            os.umask(umask)
        self._inode = inode_of(self.path)

    def gone(self) -> bool:
        """Our file is not there (never bound, removed, or replaced by another file)."""
        return self._inode is None or inode_of(self.path) != self._inode

    def remove(self) -> None:
        """Remove the file if it is still the one we bound."""
        remove_own(self.path, self._inode)
        self._inode = None
