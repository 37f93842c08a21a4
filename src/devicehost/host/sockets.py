"""Socket files in the device-plugins dir: names, ownership, and cleaning up only our own.

Names are ``devicehost-<resource>-<token>.sock``: safe as one file name, never starting with
``.``, and unique per host start (the token), so two host pods can overlap in a rolling update.
The host removes a file only if it is the very socket it created (same inode), or a stale
``devicehost-*.sock`` that no process listens on any more.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import socket
import stat
from pathlib import Path

PREFIX = "devicehost-"
SUFFIX = ".sock"
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL
KUBELET_SOCKET = "kubelet.sock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class SocketDirError(Exception):
    """The device-plugins dir cannot hold the host's sockets."""


def new_token() -> str:
    """A short random token that makes this host start's socket names unique."""
    return secrets.token_hex(3)


def socket_name(resource: str, token: str, directory: Path) -> str:
    """The socket file name for ``resource``, shortened with a hash if the path would be too long."""
    safe = _UNSAFE.sub("_", resource.replace("/", "_"))
    name = f"{PREFIX}{safe}-{token}{SUFFIX}"
    room = MAX_UNIX_PATH - len(os.fsencode(directory)) - 1
    if len(name) <= room:
        return name
    digest = hashlib.sha256(resource.encode()).hexdigest()[:8]
    keep = room - len(f"{PREFIX}-{digest}-{token}{SUFFIX}")
    if keep < 1:
        raise SocketDirError(f"device-plugins dir {directory} is too long a path for unix sockets")
    return f"{PREFIX}{safe[:keep]}-{digest}-{token}{SUFFIX}"


def check_socket_dir(directory: Path, allow_symlink: bool = False, what: str = "device-plugins dir") -> None:
    """Fail with a clear reason if the host cannot create sockets in ``directory``.

    A path that resolves elsewhere through a symlink is refused unless ``allow_symlink``: the
    kubelet reads the dir it was told, and a planted link would send the sockets (and the
    cleaning of stale ones) somewhere else.
    """
    if not allow_symlink and os.path.lexists(directory):
        real = os.path.realpath(directory)
        if real != os.path.abspath(directory):
            raise SocketDirError(
                f"{what} {directory} is a symlink (or lies under one) to {real}; "
                "point the host at the real dir, or allow symlinks in the configuration"
            )
    if not directory.exists():
        raise SocketDirError(f"{what} {directory} does not exist: is the kubelet's dir mounted into the pod?")
    if not directory.is_dir():
        raise SocketDirError(f"{what} {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SocketDirError(f"{what} {directory} is not writable by uid {os.getuid()}")
    if len(os.fsencode(directory)) + 1 + len(f"{PREFIX}x-{'0' * 8}-{new_token()}{SUFFIX}") > MAX_UNIX_PATH:
        raise SocketDirError(f"{what} {directory} is too long a path for unix sockets")


def inode_of(path: Path) -> int | None:
    """The inode of ``path`` (not following a symlink), or None if nothing is there."""
    try:
        return path.lstat().st_ino
    except FileNotFoundError:
        return None


def remove_own(path: Path, inode: int | None) -> None:
    """Remove ``path`` only if it is still the socket we created (same inode)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if inode is not None and st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
        path.unlink(missing_ok=True)


def parse_socket_name(name: str) -> tuple[str, str] | None:
    """``devicehost-<resource part>-<token>.sock`` -> (resource part, token); None for any other
    name. Two hosts serving one resource in one dir have sockets with the same resource part."""
    if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
        return None
    part, sep, token = name[len(PREFIX) : -len(SUFFIX)].rpartition("-")
    if (
        not sep
        or not part
        or len(token) != len(new_token())
        or not all(c in "0123456789abcdef" for c in token)
    ):
        return None
    return part, token


def is_listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` (a connect, then close)."""
    return _is_listening(path)


def _is_listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        try:
            probe.connect(os.fspath(path))
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
        return True


def remove_stale(directory: Path) -> list[str]:
    """Remove ``devicehost-*.sock`` sockets nobody listens on (left by a killed host); return their names."""
    removed = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISSOCK(st.st_mode) and not _is_listening(path):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def listen_early(address: str) -> socket.socket:
    """A socket bound and listening on ``BIND:PORT`` now, before the slow part of the start.

    Probes that arrive before the probe server runs wait in the listen backlog instead of
    being refused; the caller hands the socket to the probe server (``metrics_listener``).
    Raises ``OSError`` (the port is taken) and ``ValueError`` (not ``BIND:PORT``).
    """
    bind, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"metrics address {address!r} is not BIND:PORT")
    family = socket.AF_INET6 if ":" in bind.strip("[]") else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind.strip("[]") or ("::" if family == socket.AF_INET6 else "0.0.0.0"), int(port)))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener
