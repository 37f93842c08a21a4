"""The kubelet's plugin-watcher path: sockets in ``plugins_registry`` found with inotify."""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from asyncinotify import Inotify, Mask

from devicehost.hookspecs.rules import resource_name_problem
from devicehost.proto.pluginregistration.v1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import CHANNEL_OPTIONS, ConnectError
from devicehost.standin.model import VERSION

GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 1.0
PLUGIN_TYPE = "DevicePlugin"
_ADDED = Mask.CREATE | Mask.MOVED_TO
_REMOVED = Mask.DELETE | Mask.MOVED_FROM


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def validate_plugin(info: api_pb2.PluginInfo) -> str | None:
    """The plugin watcher's type check and the device manager's ``ValidatePlugin``, as kubelet text."""
    if info.type != PLUGIN_TYPE:
        return f"RegisterPlugin error -- no handler registered for plugin type: {info.type}"
    if VERSION not in info.supported_versions:
        return (
            "RegisterPlugin error -- plugin validation failed with err: manager version, "
            f"{VERSION}, is not among plugin supported versions {list(info.supported_versions)}"
        )
    if resource_name_problem(info.name):
        return (
            "RegisterPlugin error -- plugin validation failed with err: invalid name of device "
            f'plugin socket: the ResourceName "{info.name}" is invalid'
        )
    return None


class PluginWatcher:
    """Watch one directory; register each new socket, deregister it when it goes away.

    Sockets are handled one at a time, in the order inotify reports them; sockets already
    present when the watcher starts are handled first, as the kubelet walks the dir on start.
    """

    def __init__(
        self,
        directory: Path,
        register: Callable[[str, str], Awaitable[None]],
        deregister: Callable[[str], Awaitable[None]],
        failed: Callable[[str, str], None],
    ) -> None:
        self.directory = directory
        self._register = register
        self._deregister = deregister
        self._failed = failed
        self._plugins: dict[Path, str] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Add the inotify watch now, so no socket created after this call is missed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        inotify = Inotify()
        inotify.add_watch(self.directory, _ADDED | _REMOVED)
        existing = sorted(p for p in self.directory.iterdir() if not p.name.startswith("."))
        self._task = asyncio.create_task(self._run(inotify, existing), name="plugin watcher")

    async def stop(self) -> None:
        """Stop watching; registrations already made stay (the kubelet owns them)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        self._plugins.clear()

    async def _run(self, inotify: Inotify, existing: list[Path]) -> None:
        with inotify:
            for path in existing:
                await self._added(path)
            async for event in inotify:
                if event.name is None or event.name.name.startswith("."):
                    continue
                path = self.directory / event.name
                if event.mask & _ADDED:
                    await self._added(path)
                elif event.mask & _REMOVED:
                    name = self._plugins.pop(path, None)
                    if name is not None:
                        await self._deregister(name)

    async def _added(self, path: Path) -> None:
        if path in self._plugins or not _is_socket(path):
            return
        channel = grpc.aio.insecure_channel(f"unix://{path}", options=CHANNEL_OPTIONS)
        try:
            stub = api_pb2_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(
                    api_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT, wait_for_ready=True
                )
            except grpc.aio.AioRpcError as exc:
                self._failed(
                    path.name,
                    f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket "
                    f"{path}, err: {exc.code().name}: {exc.details()}",
                )
                return
            error = validate_plugin(info)
            if error is None:
                try:
                    await self._register(info.name, info.endpoint or str(path))
                except ConnectError as exc:
                    error = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
            if error is None:
                self._plugins[path] = info.name
            else:
                self._failed(info.name, error)
            status = api_pb2.RegistrationStatus(plugin_registered=error is None, error=error or "")
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
        finally:
            await channel.close(None)
