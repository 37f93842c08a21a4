"""kubelet.sock: the dir cleaning, the socket's inodes, the Register checks and handler epochs."""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.registration import CHECKPOINT, KubeletSocket, handler_epoch, register_problem

NAME = "example.com/widget"


def request(name: str = NAME, version: str = "v1beta1") -> api_pb2.RegisterRequest:
    return api_pb2.RegisterRequest(version=version, endpoint="w.sock", resource_name=name)


@pytest.mark.parametrize(
    ("name", "version", "problem"),
    [
        (NAME, "v1beta1", None),
        (NAME, "v1alpha", 'requested API version "v1alpha" is not supported by kubelet. '),
        ("widget", "v1beta1", 'the ResourceName "widget" is invalid'),
        ("kubernetes.io/widget", "v1beta1", 'the ResourceName "kubernetes.io/widget" is invalid'),
        ("requests.example.com/w", "v1beta1", 'the ResourceName "requests.example.com/w" is invalid'),
    ],
)
def test_register_problem_uses_the_kubelet_wording(name: str, version: str, problem: str | None) -> None:
    found = register_problem(request(name, version))
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)


def test_the_version_error_lists_the_supported_version() -> None:
    assert str(register_problem(request(version="v2"))).endswith('Supported versions are ["v1beta1"]')


def test_clean_dir_keeps_the_checkpoint_and_directories_only(short_tmp: Path) -> None:
    directory = short_tmp / "dp"
    directory.mkdir()
    (directory / CHECKPOINT).write_text("{}")
    (directory / "stale.sock").write_text("")
    (directory / "keep").mkdir()
    (directory / "link-to-dir").symlink_to(directory / "keep")
    (directory / "dangling").symlink_to(short_tmp / "nowhere")
    KubeletSocket(directory).clean_dir()
    assert sorted(p.name for p in directory.iterdir()) == ["keep", CHECKPOINT]


def test_clean_dir_creates_a_missing_dir(short_tmp: Path) -> None:
    KubeletSocket(short_tmp / "a" / "dp").clean_dir()
    assert (short_tmp / "a" / "dp").is_dir()


def fds_on(path: Path) -> list[int]:
    """This process's fds that point at ``path`` (deleted or not)."""
    found = []
    for entry in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.removesuffix(" (deleted)") == str(path):
            found.append(int(entry.name))
    return found


class Recorder:
    """A register callable that records each handler's epoch and context, and can refuse."""

    def __init__(self, socket: KubeletSocket, error: str | None = None) -> None:
        self.socket = socket
        self.error = error
        self.seen: list[tuple[str, int, bool]] = []
        self.contexts: list[contextvars.Context] = []

    async def __call__(self, request: api_pb2.RegisterRequest) -> str | None:
        self.seen.append((request.resource_name, handler_epoch(-1), self.socket.in_current_handler()))
        self.contexts.append(contextvars.copy_context())
        return self.error


@pytest.fixture
async def socket(short_tmp: Path) -> AsyncIterator[KubeletSocket]:
    served = KubeletSocket(short_tmp / "dp")
    served.clean_dir()
    yield served
    await served.stop()
    served.release_old_inode()


async def call_register(socket: KubeletSocket, name: str = NAME) -> None:
    async with grpc.aio.insecure_channel(f"unix://{socket.path}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(request(name), timeout=5)


async def test_serve_marks_each_handler_with_its_start(socket: KubeletSocket) -> None:
    register = Recorder(socket)
    await socket.serve(register)
    await call_register(socket)
    assert socket.epoch == 1
    assert register.seen == [(NAME, 1, True)]
    assert handler_epoch(7) == 7  # outside a handler: the default

    await socket.stop()
    await socket.serve(register)
    await call_register(socket, "example.com/second")
    assert socket.epoch == 2
    assert register.seen[-1] == ("example.com/second", 2, True)
    # A handler of the first start that ran on after the restart would now see it is stale.
    assert register.contexts[0].run(socket.in_current_handler) is False
    assert register.contexts[1].run(socket.in_current_handler) is True


async def test_a_refused_register_reaches_the_plugin_as_unknown(socket: KubeletSocket) -> None:
    await socket.serve(
        Recorder(socket, error="failed to dial device plugin: w.sock: context deadline exceeded")
    )
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call_register(socket)
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert failed.value.details() == "failed to dial device plugin: w.sock: context deadline exceeded"


async def test_each_serve_gets_a_new_inode_and_the_old_one_is_held_until_then(socket: KubeletSocket) -> None:
    await socket.serve(Recorder(socket))
    first = socket.path.stat().st_ino
    assert fds_on(socket.path) == []
    await socket.stop()
    assert len(fds_on(socket.path)) == 1  # holds the old inode so its number is not reused
    await socket.serve(Recorder(socket))
    assert socket.path.stat().st_ino != first
    assert fds_on(socket.path) == []  # let go once the new socket exists


async def test_stopping_for_good_lets_go_of_the_inode(socket: KubeletSocket) -> None:
    await socket.serve(Recorder(socket))
    await socket.stop()
    await socket.stop()  # a second stop holds nothing more
    assert len(fds_on(socket.path)) == 1
    socket.release_old_inode()
    assert fds_on(socket.path) == []
    with pytest.raises(grpc.aio.AioRpcError):
        await asyncio.wait_for(call_register(socket), 5)
