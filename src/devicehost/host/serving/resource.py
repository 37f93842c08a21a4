"""One resource's life: started by its backend, served on its own socket, kept registered.

The supervisor task of a :class:`ResourceServer` is the re-register loop: it serves the socket
again if the kubelet removed it, waits for ``kubelet.sock``, ends any old ListAndWatch stream
(so the kubelet sees it end before the new registration), registers, and then sleeps until
``kubelet.sock`` is created anew, the socket disappears, or the kubelet drops the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import structlog

from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Device, Health, Resource
from devicehost.host.backends.backend import Backend, HookError
from devicehost.host.kubelet.client import KubeletClient, RegisterError
from devicehost.host.kubelet.plugin_watcher import PluginRegistrationServicer
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.host.serving.servicer import DevicePluginServicer
from devicehost.host.serving.table import DeviceTable
from devicehost.host.sockets import inode_of, remove_own, socket_name
from devicehost.proto.deviceplugin.v1beta1 import api_pb2_grpc
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

log = structlog.get_logger(__name__)

BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 5.0
WATCHER_REREGISTER_WAIT = 1.0
"""Seconds a watcher-mode resource waits, after its stream drops, for the kubelet to register it
again by itself (a restarted kubelet walks plugins_registry) before it recreates its socket."""
SERVER_STOP_GRACE = 0.5


class Notifier:
    """The :class:`devicehost.ResourceNotifier` handed to a backend: thread-safe, fire and forget."""

    def __init__(self, loop: asyncio.AbstractEventLoop, server: ResourceServer) -> None:
        self._loop = loop
        self._server = server
        self._closed = False

    def set_health(self, health: Mapping[str, Health]) -> None:
        self._post(self._server.apply_health, dict(health))

    def set_devices(self, devices: Sequence[Device]) -> None:
        self._post(self._server.apply_devices, tuple(devices))

    def rediscover(self) -> None:
        self._post(self._server.request_rediscovery)

    def close(self) -> None:
        self._closed = True

    def _post(self, function: Callable[..., None], *args: Any) -> None:
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the host is gone
            self._loop.call_soon_threadsafe(function, *args)


class ResourceServer:
    """Serves and registers one resource of one backend."""

    def __init__(
        self,
        backend: Backend,
        resource: Resource,
        *,
        directory: Path,
        token: str,
        socket_mode: int,
        health_interval: float,
        watcher: KubeletSocketWatch,
        client: KubeletClient,
        request_rediscovery: Callable[[], None],
        observe_allocation: Callable[[float], None],
        registry_dir: Path | None = None,
    ) -> None:
        self.backend = backend
        self.watcher_mode = registry_dir is not None
        """Registered through the kubelet's plugin watcher (socket in ``registry_dir``), not Register."""
        directory = registry_dir or directory
        self.name = resource.name
        self.table = DeviceTable(resource.devices)
        self._discovered_health = {d.id: d.health for d in resource.devices}
        self.directory = directory
        self.socket_name = socket_name(resource.name, token, directory)
        self.health_interval = health_interval
        self.registrations = 0
        self.registration_reasons: Counter[str] = Counter()
        self.last_registration_seconds: float | None = None
        self._token = token
        self._socket_mode = socket_mode
        self._watcher = watcher
        self._client = client
        self._request_rediscovery = request_rediscovery
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None
        self._registered_generation: int | None = None
        self._stream_lost = False
        self._watcher_status: tuple[bool, str] | None = None
        self._socket_created = 0.0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._notifier = Notifier(asyncio.get_running_loop(), self)
        self.servicer = DevicePluginServicer(
            backend, resource.name, self.table, self._on_stream_lost, observe_allocation
        )
        self._log = log.bind(resource=self.name, backend=backend.name)

    @property
    def path(self) -> Path:
        return self.directory / self.socket_name

    @property
    def registered(self) -> bool:
        """Registered with the current kubelet and streaming to it."""
        if self.watcher_mode:
            return (
                self._watcher_status is not None
                and self._watcher_status[0]
                and self.servicer.open_streams > 0
            )
        return (
            self._registered_generation == self._watcher.generation
            and self._watcher.inode is not None
            and self.servicer.open_streams > 0
        )

    async def start(self) -> None:
        """Call the backend's start hook, serve the socket, and begin registering."""
        with structlog.contextvars.bound_contextvars(resource=self.name, backend=self.backend.name):
            await self.backend.start(self.name, self._notifier)
            await self._serve()
            supervise = self._supervise_watcher() if self.watcher_mode else self._supervise()
            task = asyncio.create_task(supervise, name=f"register {self.name}")
            task.add_done_callback(self._supervisor_ended)
            self._tasks.append(task)
            if self.backend.implements("devicehost_health"):
                self._tasks.append(asyncio.create_task(self._poll_health(), name=f"health {self.name}"))
        self._watcher.subscribe(self._on_dir_change)

    async def stop(self) -> None:
        """Withdraw: stop registering, end streams, stop serving, remove the socket, call stop."""
        self._stopping = True
        self._watcher.unsubscribe(self._on_dir_change)
        self._notifier.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_server()
        try:
            await self.backend.stop(self.name)
        except HookError as exc:
            self._log.error("stop hook failed", error=str(exc))
        self._log.info("withdrawn")

    def apply_discovery(self, devices: tuple[Device, ...]) -> None:
        """Take a rediscovered device list; its health counts only where discovery's view changed.

        Health also arrives pushed (notifier) and polled (health hook): a discovery that reports
        the same health for a device as last time says nothing new, so it must not undo a newer
        pushed or polled state. Every source reports changes, and the latest change wins.
        """
        current = {d.id: d for d in self.table.devices}
        merged = tuple(
            Device(d.id, current[d.id].health, d.numa_nodes)
            if d.id in current and self._discovered_health.get(d.id) == d.health
            else d
            for d in devices
        )
        self._discovered_health = {d.id: d.health for d in devices}
        self.apply_devices(merged)

    def apply_devices(self, devices: tuple[Device, ...]) -> None:
        """Take a new device list from discovery or the backend's notifier, if it is valid."""
        if not all(isinstance(d, Device) for d in devices):
            self._log.error("device list refused: items must be devicehost.Device")
            return
        problem = rules.device_ids_problem(d.id for d in devices)
        if problem:
            self._log.error("device list refused, keeping the previous one", problem=problem)
            return
        if self.table.replace(devices):
            self._log.info("devices changed", devices=len(devices), healthy=self.table.healthy_count())

    def apply_health(self, health: Mapping[str, Any]) -> None:
        """Take health values from the backend's notifier or health hook."""
        try:
            values = {str(k): Health(v) for k, v in health.items()}
        except ValueError as exc:
            self._log.error("health update refused", problem=str(exc))
            return
        if self.table.set_health(values):
            self._log.info(
                "health changed", healthy=self.table.healthy_count(), devices=len(self.table.devices)
            )

    def request_rediscovery(self) -> None:
        self._request_rediscovery()

    def _on_stream_lost(self, epoch: int) -> None:
        """A stream of the current registration ended on the kubelet's side: register again."""
        if epoch == self.servicer.epoch:
            self._stream_lost = True
            self._wake.set()

    def _socket_gone(self) -> bool:
        """Our socket file is not there (or is not the one we bound): serve again."""
        return self._inode is None or inode_of(self.path) != self._inode

    def _on_dir_change(self) -> None:
        if self._socket_gone() or self._watcher.generation != self._registered_generation:
            self._wake.set()

    async def _serve(self) -> None:
        """Start a gRPC server on a fresh socket file (never over a file we did not create)."""
        attempt = 0
        while inode_of(self.path) is not None:
            attempt += 1
            taken = self.path
            self.socket_name = socket_name(self.name, f"{self._token}{attempt}", self.directory)
            self._log.warning(
                "socket path is taken by a file we did not create", path=str(taken), using=str(self.path)
            )
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        if self.watcher_mode:
            registration = PluginRegistrationServicer(
                self.name, lambda: str(self.path), self._on_watcher_status
            )
            registration_grpc.add_RegistrationServicer_to_server(registration, server)
        # The socket file is created by bind() inside add_insecure_port: the umask gives it its
        # mode from the start (no chmod race with a kubelet cleaning the dir, nothing to follow).
        # The umask is process-wide, so files other threads create meanwhile only get stricter.
        umask = os.umask(0o777 & ~self._socket_mode)
        try:
            server.add_insecure_port(f"unix:{self.path}")
        finally:
            os.umask(umask)
        self._inode = inode_of(self.path)
        await server.start()
        self._server = server
        self._socket_created = time.monotonic()
        self._watcher_status = None
        self._log.info("serving", socket=str(self.path))

    async def _stop_server(self) -> None:
        await self.servicer.end_streams()
        if self._server is not None:
            await self._server.stop(SERVER_STOP_GRACE)
            self._server = None
        remove_own(self.path, self._inode)
        self._inode = None

    async def _supervise(self) -> None:
        """The re-register loop; runs until the resource is withdrawn, whatever goes wrong in it."""
        while True:
            try:
                await self._register_forever()
            except Exception:
                self._log.exception("the re-register loop failed; starting it again")
                await asyncio.sleep(BACKOFF_MAX)

    async def _register_forever(self) -> None:
        delay = BACKOFF_INITIAL
        reason = "start"
        while True:
            self._wake.clear()
            if self._socket_gone():
                self._log.info("socket was removed, serving again")
                await self._stop_server()
                await self._serve()
                reason = "socket removed"
            generation = self._watcher.generation
            if self._watcher.inode is None:
                self._log.info("waiting for the kubelet", socket=str(self._watcher.kubelet_socket))
                await self._watcher.wait_present()
                reason = "kubelet appeared"
                continue
            if generation == self._registered_generation and not self._stream_lost:
                await self._wake.wait()
                reason = "kubelet restarted" if self._watcher.generation != generation else "stream lost"
                continue
            if self._stream_lost:
                reason = "stream lost"
            await self.servicer.end_streams()
            self._stream_lost = False
            self.servicer.epoch += 1
            started = time.monotonic()
            try:
                await self._client.register(self.name, self.socket_name, self.servicer.options)
            except RegisterError as exc:
                self._registered_generation = None
                self._log.warning("register failed", error=str(exc), retry_in=round(delay, 3))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_INITIAL
            self._registered_generation = generation
            self.registrations += 1
            self.registration_reasons[reason] += 1
            self.last_registration_seconds = time.monotonic() - started
            self._log.info(
                "registered",
                reason=reason,
                registrations=self.registrations,
                took_ms=round(self.last_registration_seconds * 1000, 2),
            )

    def _supervisor_ended(self, task: asyncio.Task[None]) -> None:
        if not self._stopping:
            how = "cancelled" if task.cancelled() else repr(task.exception())
            self._log.error("the re-register loop ended unexpectedly", how=how)

    def _on_watcher_status(self, registered: bool, error: str) -> None:
        """The kubelet's plugin watcher reports the outcome of registering this socket."""
        self._watcher_status = (registered, error)
        if registered:
            self.registrations += 1
            self.registration_reasons["plugin watcher"] += 1
            self.last_registration_seconds = time.monotonic() - self._socket_created
            self._log.info("registered through the plugin watcher", registrations=self.registrations)
        else:
            self._log.error("the kubelet refused the registration", error=error)
            self._wake.set()

    async def _supervise_watcher(self) -> None:
        """Watcher mode: serve the socket in plugins_registry again whenever the kubelet lost it."""
        delay = BACKOFF_INITIAL
        while True:
            self._wake.clear()
            refused = self._watcher_status is not None and not self._watcher_status[0]
            if not self._socket_gone() and not self._stream_lost and not refused:
                await self._wake.wait()
                continue
            if self._stream_lost and not refused:
                # a restarted kubelet registers the sockets it finds: give it the chance first
                await asyncio.sleep(WATCHER_REREGISTER_WAIT)
                self._stream_lost = False
                if self.servicer.open_streams and not self._socket_gone():
                    continue
            if refused:
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            else:
                delay = BACKOFF_INITIAL
            self._log.info("serving the plugin watcher socket again")
            self._stream_lost = False
            await self._stop_server()
            await self._serve()

    async def _poll_health(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            try:
                health = await self.backend.health(self.name, self.table.devices)
            except HookError as exc:
                self._log.error("health hook failed", error=str(exc))
                continue
            self.apply_health(health)
