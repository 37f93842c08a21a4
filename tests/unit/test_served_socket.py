"""ServedSocket: one resource's socket file, bound with its mode, never over or removing a foreign file."""

from __future__ import annotations

import os
import socket as pysocket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from devicehost.host.serving.socket import ServedSocket

RESOURCE = "example.com/widget"


@pytest.fixture
async def server() -> AsyncIterator[grpc.aio.Server]:
    server = grpc.aio.server()
    yield server
    await server.stop(None)


def current_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def foreign_socket(path: Path) -> pysocket.socket:
    """Another process's socket file at ``path`` (the caller closes it)."""
    sock = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    return sock


def test_the_name_is_a_file_in_the_directory(short_tmp: Path) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    assert socket.path == short_tmp / socket.name
    assert "/" not in socket.name
    assert socket.name.startswith("devicehost-")
    assert socket.name.endswith(".sock")
    assert "abc" in socket.name


@pytest.mark.parametrize("mode", [0o600, 0o660])
async def test_bind_creates_the_socket_file_with_the_mode(
    short_tmp: Path, server: grpc.aio.Server, mode: int
) -> None:
    umask = current_umask()
    socket = ServedSocket(RESOURCE, short_tmp, "abc", mode)
    assert socket.gone()  # never bound

    socket.bind(server)

    st = socket.path.lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == mode
    assert current_umask() == umask  # restored
    assert not socket.gone()


async def test_bound_socket_is_served(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    await server.start()
    with pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        probe.connect(os.fspath(socket.path))


def plant_file(path: Path) -> None:
    path.write_text("not yours")


def plant_dangling_symlink(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


def plant_dir(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("not yours")


@pytest.mark.parametrize("plant", [plant_file, plant_dangling_symlink, plant_dir])
async def test_a_path_taken_by_a_foreign_file_is_left_alone(
    short_tmp: Path, server: grpc.aio.Server, plant: object
) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    taken = socket.path
    plant(taken)  # type: ignore[operator]
    before = taken.lstat()

    socket.bind(server)

    assert socket.path != taken
    assert socket.path.parent == short_tmp
    assert stat.S_ISSOCK(socket.path.lstat().st_mode)
    assert not socket.gone()
    after = taken.lstat()
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino,
        before.st_mode,
        before.st_mtime_ns,
    )

    socket.remove()
    assert not socket.path.exists()
    assert taken.lstat().st_ino == before.st_ino
    if taken.is_file():
        assert taken.read_text() == "not yours"


async def test_every_taken_name_is_skipped(short_tmp: Path, server: grpc.aio.Server) -> None:
    first = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    plant_file(first.path)
    plant_file(short_tmp / ServedSocket(RESOURCE, short_tmp, "abc1", 0o600).name)

    first.bind(server)

    assert first.name == ServedSocket(RESOURCE, short_tmp, "abc2", 0o600).name
    assert stat.S_ISSOCK(first.path.lstat().st_mode)
    assert sorted(p.name for p in short_tmp.iterdir() if p.is_file()) == sorted(
        [ServedSocket(RESOURCE, short_tmp, t, 0o600).name for t in ("abc", "abc1")]
    )


async def test_gone_after_the_file_is_removed(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    os.unlink(socket.path)
    assert socket.gone()


async def test_gone_after_the_file_is_replaced_by_another(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    ours = socket.path.lstat().st_ino
    os.unlink(socket.path)
    plant_file(socket.path)
    assert socket.path.lstat().st_ino != ours  # our server still holds the old inode

    assert socket.gone()


async def test_gone_after_the_file_is_renamed_over(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    other = short_tmp / "other"
    plant_file(other)
    os.replace(other, socket.path)

    assert socket.gone()


async def test_remove_removes_its_own_file(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)

    socket.remove()

    assert not os.path.lexists(socket.path)
    assert socket.gone()
    socket.remove()  # again: nothing there, nothing raised


async def test_remove_leaves_a_file_that_replaced_ours(short_tmp: Path, server: grpc.aio.Server) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    os.unlink(socket.path)
    plant_file(socket.path)

    socket.remove()

    assert socket.path.read_text() == "not yours"
    assert socket.gone()


async def test_remove_leaves_a_foreign_socket_that_replaced_ours(
    short_tmp: Path, server: grpc.aio.Server
) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    socket.bind(server)
    os.unlink(socket.path)
    with foreign_socket(socket.path):
        theirs = socket.path.lstat().st_ino

        socket.remove()

        assert socket.path.lstat().st_ino == theirs


async def test_remove_before_bind_touches_nothing(short_tmp: Path) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    with foreign_socket(socket.path):
        socket.remove()
        assert stat.S_ISSOCK(socket.path.lstat().st_mode)


async def test_bind_again_after_remove_uses_the_same_name(short_tmp: Path) -> None:
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o660)
    first = grpc.aio.server()
    second = grpc.aio.server()
    try:
        socket.bind(first)
        name = socket.name
        await first.stop(None)
        socket.remove()

        socket.bind(second)

        assert socket.name == name
        assert not socket.gone()
        assert stat.S_IMODE(socket.path.lstat().st_mode) == 0o660
    finally:
        await first.stop(None)
        await second.stop(None)
        socket.remove()


async def test_after_remove_a_new_file_at_the_path_is_never_ours(short_tmp: Path) -> None:
    """Once removed (and the server stopped), the inode number is free: the next file may get it."""
    socket = ServedSocket(RESOURCE, short_tmp, "abc", 0o600)
    server = grpc.aio.server()
    socket.bind(server)
    await server.stop(None)
    socket.remove()

    with foreign_socket(socket.path):
        assert socket.gone()
        socket.remove()
        assert stat.S_ISSOCK(socket.path.lstat().st_mode)
