"""The kubelet's plugin-watcher path: sockets in ``plugins_registry`` found with inotify.

Each socket's ``GetInfo`` names its plugin type; the handler of that type (the kubelet's
``cache.PluginHandler``: device plugins, DRA drivers) validates and registers it, and the
outcome goes back with ``NotifyRegistrationStatus``. Removing the socket deregisters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from asyncinotify import Inotify, Mask

from devicehost.hookspecs.rules import resource_name_problem
from devicehost.proto.pluginregistration.v1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import CHANNEL_OPTIONS, ConnectError
from devicehost.standin.model import VERSION

GET_INFO_TIMEOUT = 1.0
RETRY_AFTER = 1.0
"""Seconds before a socket whose GetInfo failed is tried again (the kubelet's reconciler loop)."""
NOTIFY_TIMEOUT = 1.0
PLUGIN_TYPE = "DevicePlugin"
_ADDED = Mask.CREATE | Mask.MOVED_TO
_REMOVED = Mask.DELETE | Mask.MOVED_FROM


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def device_plugin_problem(name: str, endpoint: str, versions: Sequence[str]) -> str | None:
    """The device manager's ``ValidatePlugin``, as kubelet text, or ``None``."""
    if VERSION not in versions:
        return f"manager version, {VERSION}, is not among plugin supported versions {list(versions)}"
    if resource_name_problem(name):
        return f'invalid name of device plugin socket: the ResourceName "{name}" is invalid'
    return None


@dataclass(frozen=True)
class PluginHandler:
    """What the kubelet does with sockets of one plugin type."""

    validate: Callable[[str, str, Sequence[str]], str | None]
    """(name, endpoint, supported versions) -> the validation error, or ``None``."""
    register: Callable[[str, str], Awaitable[str | None]]
    """(name, endpoint) -> the registration error (or a ``ConnectError`` raised), or ``None``."""
    deregister: Callable[[str, str], Awaitable[None]]
    """(name, endpoint): the registration socket went away."""


class PluginWatcher:
    """Watch one directory; register each new socket, deregister it when it goes away.

    Sockets are handled one at a time, in the order inotify reports them; sockets already
    present when the watcher starts are handled first, as the kubelet walks the dir on start.
    A socket of a type in ``ignored`` is left alone (asked ``GetInfo`` only, never answered).
    A socket whose ``GetInfo`` fails (its server not answering yet) is tried again every
    :data:`RETRY_AFTER` s while it is there, as the kubelet's reconciler does.
    """

    def __init__(
        self,
        directory: Path,
        handlers: Mapping[str, PluginHandler],
        failed: Callable[[str, str], None],
        ignored: Collection[str] = (),
    ) -> None:
        self.directory = directory
        self._handlers = dict(handlers)
        self._failed = failed
        self._ignored = frozenset(ignored)
        self._plugins: dict[Path, tuple[PluginHandler, str, str]] = {}
        """Registered sockets: their handler, name and endpoint."""
        self._task: asyncio.Task[None] | None = None
        self._retries: set[asyncio.Task[None]] = set()

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
        for retry in self._retries:
            retry.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)
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
                    registered = self._plugins.pop(path, None)
                    if registered is not None:
                        handler, name, endpoint = registered
                        await handler.deregister(name, endpoint)

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
                retry = asyncio.create_task(self._again(path), name=f"register {path.name} again")
                self._retries.add(retry)
                retry.add_done_callback(self._retries.discard)
                return
            handler = self._handlers.get(info.type)
            if handler is None and info.type in self._ignored:
                return
            endpoint = info.endpoint or str(path)
            error = await self._register(handler, info, endpoint)
            if error is None and handler is not None:
                self._plugins[path] = (handler, info.name, endpoint)
            else:
                self._failed(info.name or path.name, error or "")
            status = api_pb2.RegistrationStatus(plugin_registered=error is None, error=error or "")
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
        finally:
            await channel.close(None)

    async def _again(self, path: Path) -> None:
        await asyncio.sleep(RETRY_AFTER)
        if _is_socket(path):
            await self._added(path)

    @staticmethod
    async def _register(handler: PluginHandler | None, info: api_pb2.PluginInfo, endpoint: str) -> str | None:
        """The kubelet's checks and its handler's registration; its error text, or ``None``."""
        if handler is None:
            return f"RegisterPlugin error -- no handler registered for plugin type: {info.type}"
        problem = handler.validate(info.name, endpoint, list(info.supported_versions))
        if problem is not None:
            return f"RegisterPlugin error -- plugin validation failed with err: {problem}"
        try:
            problem = await handler.register(info.name, endpoint)
        except ConnectError as exc:
            problem = str(exc)
        if problem is not None:
            return f"RegisterPlugin error -- plugin registration failed with err: {problem}"
        return None
