"""Socket files in the device-plugins dir: names, ownership, and cleaning up only our own.

Names are ``devicehost-<resource>-<token>.sock``: safe as one file name, never starting with
``.``, and unique per host start (the token), so two host pods can overlap in a rolling update.
The host removes a file only if it is the very socket it created (same inode), or a stale
``devicehost-*.sock`` that no process listens on any more.

A unix socket's path has at most :data:`MAX_UNIX_PATH` bytes. A name that would pass it (a long
resource or driver name under a deep kubelet root, such as microk8s's
``/var/snap/microk8s/common/var/lib/kubelet``) keeps its start and gets a hash of the whole
(:func:`fitted`): the same for every host start in the same dir, so the sockets of two hosts
serving one resource still share their resource part. A dir too long for even the shortest name
is refused at start (:func:`check_path_room`).
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
HASH_LENGTH = 8
"""Hex digits of the hash a shortened name ends with."""
TOKEN_LENGTH = 6
"""Characters of a host start's token (:func:`new_token`)."""
SHORTEST_NAME = len(f"{PREFIX}x-{'0' * HASH_LENGTH}-{'0' * TOKEN_LENGTH}{SUFFIX}")
"""Bytes of the shortest socket name the host makes: a resource name cut to one character."""
KUBELET_SOCKET = "kubelet.sock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class SocketDirError(Exception):
    """The device-plugins dir cannot hold the host's sockets."""


def new_token() -> str:
    """A short random token that makes this host start's socket names unique."""
    return secrets.token_hex(TOKEN_LENGTH // 2)


def fitted(name: str, room: int, whole: str = "") -> str | None:
    """``name`` (ASCII) if it has at most ``room`` characters, else its start and a hash of
    ``whole`` (default: ``name``), ``<start>-<8 hex>``, in ``room``; None when not even one
    character of it fits."""
    if len(name) <= room:
        return name
    keep = room - HASH_LENGTH - 1
    if keep < 1:
        return None
    return f"{name[:keep]}-{hashlib.sha256((whole or name).encode()).hexdigest()[:HASH_LENGTH]}"


def socket_name(resource: str, token: str, directory: Path) -> str:
    """The socket file name for ``resource``, shortened with a hash if the path would be too long.

    :raises SocketDirError: ``directory`` leaves no room even for the shortest name.
    """
    safe = _UNSAFE.sub("_", resource.replace("/", "_"))
    room = MAX_UNIX_PATH - len(os.fsencode(directory)) - 1 - len(f"{PREFIX}-{token}{SUFFIX}")
    part = fitted(safe, room, resource)
    if part is None:
        raise SocketDirError(f"{directory} is too long a path for unix sockets")
    return f"{PREFIX}{part}-{token}{SUFFIX}"


def check_path_room(directory: Path, setting: str, needed: int = SHORTEST_NAME) -> None:
    """Refuse ``directory`` (the value of ``setting``) when a path below it of ``needed`` more
    bytes (after a ``/``) would pass the unix socket limit.

    :raises SocketDirError: one line naming the setting, the dir and the bytes too many.
    """
    over = len(os.fsencode(directory)) + 1 + needed - MAX_UNIX_PATH
    if over > 0:
        raise SocketDirError(
            f"{setting} {directory} is too long for unix sockets by {over} bytes: a socket path has "
            f"at most {MAX_UNIX_PATH} bytes and the host's shortest below it needs {needed + 1}"
        )


def check_socket_dir(
    directory: Path,
    allow_symlink: bool = False,
    what: str = "device-plugins dir",
    setting: str = "device_plugins_dir",
) -> None:
    """Fail with a clear reason if the host cannot create sockets in ``directory`` (the value of
    ``setting``).

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
    check_path_room(directory, setting)


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
    if not sep or not part or len(token) != TOKEN_LENGTH or not all(c in "0123456789abcdef" for c in token):
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
