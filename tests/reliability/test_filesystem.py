"""Filesystem safety: never remove or overwrite what the host did not create; private sockets."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path

import pytest
from faultkit import Ledger, wait_until
from hostfakes import ScriptedBackend, running_host, socket_files, widgets

from devicehost.host.sockets import SocketDirError, check_socket_dir, socket_name
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)

NAME = "example.com/widget"


def listening_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(4)
    return sock


@pytest.mark.parametrize("planted", ["another plugin's live socket", "symlink", "regular file"])
async def test_what_sits_at_the_socket_path_is_left_alone(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path, planted: str, ledger: Ledger
) -> None:
    """The host serves under another name and leaves the planted file exactly as it was."""
    backend = ScriptedBackend(widgets(NAME, 2))
    target = short_tmp / "precious"
    target.write_text("keep me")
    other: socket.socket | None = None
    try:
        async with running_host(plugin_dir, {"b": backend}) as host:
            path = plugin_dir / socket_name(NAME, host.token, plugin_dir)  # before the host runs
            if planted.startswith("another"):
                other = listening_socket(path)
            elif planted == "symlink":
                path.symlink_to(target)
            else:
                path.write_text("not a socket")
            before = path.lstat()
            await kubelet.wait_for_resource(NAME, healthy=2)
            assert host.resources[NAME].socket.path != path
            assert path.lstat().st_ino == before.st_ino
            assert stat.S_IFMT(path.lstat().st_mode) == stat.S_IFMT(before.st_mode)
        assert path.lstat().st_ino == before.st_ino  # still there after the host stopped
        assert target.read_text() == "keep me"
        assert socket_files(plugin_dir) == [path.name]
    finally:
        if other is not None:
            other.close()
    ledger.add("files planted at a socket path and left alone")


async def test_sockets_are_private_whatever_the_umask(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    old = os.umask(0)
    try:
        backend = ScriptedBackend(widgets(NAME, 1), widgets("example.com/other", 1))
        async with running_host(plugin_dir, {"b": backend}):
            await kubelet.wait_for_resource(NAME, healthy=1)
            await kubelet.wait_for_resource("example.com/other", healthy=1)
            modes = {stat.S_IMODE((plugin_dir / s).stat().st_mode) for s in socket_files(plugin_dir)}
            assert modes == {0o600}
    finally:
        os.umask(old)


async def test_stale_sockets_of_a_killed_host_go_live_ones_of_another_host_stay(
    kubelet: KubeletStandIn, plugin_dir: Path, ledger: Ledger
) -> None:
    """At start the host removes only devicehost-*.sock sockets nobody listens on."""
    dead = listening_socket(plugin_dir / "devicehost-example.com_old-abcdef.sock")
    dead.close()  # a SIGKILLed host leaves its socket file behind
    alive = listening_socket(plugin_dir / "devicehost-example.com_peer-123456.sock")
    foreign_dead = listening_socket(plugin_dir / "vendor-plugin.sock")
    foreign_dead.close()
    try:
        backend = ScriptedBackend(widgets(NAME, 1))
        async with running_host(plugin_dir, {"b": backend}):
            await kubelet.wait_for_resource(NAME, healthy=1)
            names = sorted(p.name for p in plugin_dir.iterdir())
            assert "devicehost-example.com_old-abcdef.sock" not in names
            assert "devicehost-example.com_peer-123456.sock" in names
            assert "vendor-plugin.sock" in names
    finally:
        alive.close()
    ledger.add("stale sockets cleaned, live ones kept", 1)


def test_a_symlinked_device_plugins_dir_is_refused_unless_allowed(short_tmp: Path) -> None:
    real = short_tmp / "elsewhere"
    real.mkdir()
    link = short_tmp / "dp"
    link.symlink_to(real)
    with pytest.raises(SocketDirError, match="is a symlink"):
        check_socket_dir(link)
    check_socket_dir(link, allow_symlink=True)
    check_socket_dir(real)


async def test_dir_deleted_and_recreated(kubelet: KubeletStandIn, plugin_dir: Path, ledger: Ledger) -> None:
    """The dir goes away with everything in it and comes back with a new kubelet: served again."""
    backend = ScriptedBackend(widgets(NAME, 2))
    async with running_host(plugin_dir, {"b": backend}) as host:
        await kubelet.wait_for_resource(NAME, healthy=2)
        await kubelet.stop()
        shutil.rmtree(plugin_dir)
        await wait_until(lambda: not plugin_dir.exists(), 2, "the dir to be gone")
        await kubelet.start()  # recreates the dir
        view = await kubelet.wait_for_resource(NAME, healthy=2, timeout=10)
        assert view.registrations == 2
        assert len(socket_files(plugin_dir)) == 1
        assert host.snapshot().resource(NAME).registered
    ledger.add("device-plugins dir deleted and recreated")
