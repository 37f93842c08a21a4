"""A kubelet stand-in: the device manager's side of the device plugin protocol, over grpc.aio.

It serves ``v1beta1.Registration`` on ``<device-plugins dir>/kubelet.sock``, dials each plugin
back before answering ``Register``, reads every ``ListAndWatch`` stream once (never retried)
and models kubelet 1.32 where plugins trip over it. Tests drive and inspect it::

    async with KubeletStandIn(tmp / "dp") as kubelet:
        ...  # start the plugin under test
        view = await kubelet.wait_for_resource("example.com/widget", healthy=4)
        result = await kubelet.allocate("example.com/widget", 2)
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
import structlog

from devicehost.hookspecs.rules import resource_name_problem
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import ConnectError, PluginConnection
from devicehost.standin.model import (
    AdmissionError,
    AllocationResult,
    DeviceView,
    Event,
    EventKind,
    ListRecord,
    ResourceView,
)
from devicehost.standin.plugin_watcher import PluginWatcher

__all__ = [
    "AdmissionError",
    "AllocationResult",
    "DeviceView",
    "Event",
    "EventKind",
    "KubeletStandIn",
    "ListRecord",
    "ResourceView",
]

VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
DEPRECATION = "DEPRECATION"
PRE_START_TIMEOUT = 30.0


@dataclass
class _Resource:
    name: str
    conn: PluginConnection | None = None
    endpoint: str = ""
    options: api_pb2.DevicePluginOptions = field(default_factory=api_pb2.DevicePluginOptions)
    connected: bool = False
    streaming: bool = False
    registrations: int = 0
    devices: tuple[DeviceView, ...] = ()
    history: list[ListRecord] = field(default_factory=list)
    allocated: set[str] = field(default_factory=set)

    def view(self) -> ResourceView:
        return ResourceView(
            self.name, self.endpoint, self.connected, self.devices, self.options, self.registrations
        )


_handler_epoch: contextvars.ContextVar[int] = contextvars.ContextVar("kubelet_handler_epoch")
"""Which start of the stand-in a Register handler belongs to."""


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self, register: Callable[[api_pb2.RegisterRequest], Awaitable[str | None]], epoch: int
    ) -> None:
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


class KubeletStandIn:
    """The kubelet's device manager, for tests and ``devicehost run --simulate-kubelet``.

    ``close_replaced_streams=False`` models kubelet 1.32: a second ``Register`` of a resource
    leaves the old connection open, and when that old stream ends the resource is disconnected.
    ``True`` models newer kubelets, which close the replaced connection quietly. A disconnected
    resource stays at allocatable 0 until it registers again (the kubelet's end state once its
    5-minute grace period is over; the grace period itself is not modelled).

    Waits and plugin calls take a ``timeout`` (the real kubelet has none; tests need one),
    hence the ``noqa: ASYNC109`` on those signatures.
    """

    def __init__(
        self,
        device_plugins_dir: Path,
        plugins_registry_dir: Path | None = None,
        *,
        watcher: bool = False,
        close_replaced_streams: bool = False,
        dial_timeout: float = 10.0,
    ) -> None:
        if watcher and plugins_registry_dir is None:
            raise ValueError("watcher=True needs plugins_registry_dir")
        self.device_plugins_dir = Path(device_plugins_dir)
        self.plugins_registry_dir = plugins_registry_dir
        self.socket_path = self.device_plugins_dir / KUBELET_SOCKET
        self.close_replaced_streams = close_replaced_streams
        self.dial_timeout = dial_timeout
        self._watcher_enabled = watcher
        self._watcher: PluginWatcher | None = None
        self._server: grpc.aio.Server | None = None
        self._old_socket_fd: int | None = None
        self._resources: dict[str, _Resource] = {}
        self._conns: set[PluginConnection] = set()
        self._events: list[Event] = []
        self._changed = asyncio.Event()
        self._epoch = 0
        self._log = structlog.get_logger("devicehost.kubelet")

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Clean the dir except the checkpoint, then serve ``kubelet.sock`` (a new inode)."""
        self.device_plugins_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.device_plugins_dir.iterdir():
            if entry.name != CHECKPOINT and (entry.is_symlink() or not entry.is_dir()):
                entry.unlink()
        if self._watcher_enabled and self.plugins_registry_dir is not None:
            (self.device_plugins_dir / DEPRECATION).write_text(
                "Device plugins may register through the plugins_registry dir.\n"
            )
            self._watcher = PluginWatcher(
                self.plugins_registry_dir, self._connect_client, self._deregister, self._register_failed
            )
            self._watcher.start()
        server = grpc.aio.server()
        self._epoch += 1
        api_pb2_grpc.add_RegistrationServicer_to_server(
            _RegistrationServicer(self._register, self._epoch), server
        )
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self._release_old_socket()
        self._log.info("kubelet started", socket=str(self.socket_path))

    async def stop(self) -> None:
        """Stop serving and close every plugin connection; no task is left running."""
        await self._shutdown("kubelet stopped")
        self._release_old_socket()

    async def restart(self) -> None:
        """Restart as the kubelet does: connections close, the dir is cleaned, a new socket."""
        await self._shutdown("kubelet restarted")
        await self.start()

    async def crash(self, down_for: float) -> None:
        """Stop answering and remove ``kubelet.sock`` for ``down_for`` seconds, then start again."""
        await self._shutdown("kubelet crashed")
        self.socket_path.unlink(missing_ok=True)
        await asyncio.sleep(down_for)
        await self.start()

    async def _shutdown(self, reason: str) -> None:
        if self._old_socket_fd is None and self.socket_path.exists():
            # Hold the old inode until the next socket exists, so its number cannot be reused:
            # plugins may tell a kubelet restart by the inode number alone.
            self._old_socket_fd = os.open(self.socket_path, os.O_PATH)
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        for res in self._resources.values():
            res.conn = None
            res.streaming = False
            if res.connected:
                res.connected = False
                self._emit(EventKind.DISCONNECTED, res.name, reason)
        await asyncio.gather(*(conn.close() for conn in list(self._conns)))

    # -- registration ------------------------------------------------------------------------

    def _release_old_socket(self) -> None:
        if self._old_socket_fd is not None:
            os.close(self._old_socket_fd)
            self._old_socket_fd = None

    async def _register(self, request: api_pb2.RegisterRequest) -> str | None:
        name = request.resource_name
        if request.version != VERSION:
            error = (
                f'requested API version "{request.version}" is not supported by kubelet. '
                f'Supported versions are ["{VERSION}"]'
            )
        elif resource_name_problem(name):
            error = f'the ResourceName "{name}" is invalid'
        else:
            try:
                await self._connect_client(name, str(self.device_plugins_dir / request.endpoint))
            except ConnectError as exc:
                error = str(exc)
            else:
                return None
        self._register_failed(name, error)
        return error

    def _register_failed(self, name: str, error: str) -> None:
        self._emit(EventKind.REGISTER_FAILED, name, error)

    async def _connect_client(self, name: str, socket_path: str) -> None:
        conn = PluginConnection(name, socket_path, self._on_list, self._on_stream_end)
        try:
            options = await conn.connect(self.dial_timeout)
            if _handler_epoch.get(self._epoch) != self._epoch:  # a real kubelet's handler dies with it
                raise ConnectError("kubelet restarted during the registration")
        except BaseException:
            await conn.close()
            raise
        self._conns.add(conn)
        res = self._resources.setdefault(name, _Resource(name))
        old = res.conn
        res.conn, res.endpoint, res.options = conn, socket_path, options
        res.connected, res.streaming = True, False
        res.registrations += 1
        if old is not None:
            how = "closed" if self.close_replaced_streams else "left open"
            self._emit(EventKind.REPLACED, name, f"{old.socket_path} replaced, its stream {how}")
            if self.close_replaced_streams:
                await old.close()
        self._emit(EventKind.REGISTERED, name, f"endpoint {socket_path}, options {_describe(options)}")
        conn.start_stream()

    async def _deregister(self, name: str) -> None:
        res = self._resources.pop(name, None)
        if res is None:
            return
        if res.conn is not None:
            await res.conn.close()
        self._emit(EventKind.DEREGISTERED, name, "plugin socket removed")

    def _on_list(self, conn: PluginConnection, response: api_pb2.ListAndWatchResponse) -> None:
        res = self._resources.get(conn.resource)
        if res is None or conn.closing:
            return
        # Kubelet 1.32 keys updates by resource name: a replaced stream still updates devices.
        devices = tuple(DeviceView.from_proto(d) for d in response.devices)
        res.history.append(ListRecord(time.monotonic(), devices))
        res.streaming = res.streaming or conn is res.conn
        if devices != res.devices:
            res.devices = devices
            healthy = sum(d.healthy for d in devices)
            self._emit(EventKind.DEVICES, res.name, f"{healthy} of {len(devices)} healthy")
        else:
            self._changed_now()

    def _on_stream_end(self, conn: PluginConnection, reason: str) -> None:
        self._conns.discard(conn)
        res = self._resources.get(conn.resource)
        if conn.closing or res is None or not res.connected:
            return
        if conn is not res.conn:
            reason = f"the replaced stream from {conn.socket_path} ended ({reason})"
        res.connected = res.streaming = False
        self._emit(EventKind.DISCONNECTED, res.name, reason)

    def _emit(self, kind: EventKind, resource: str, detail: str) -> None:
        self._events.append(Event(time.monotonic(), kind, resource, detail))
        self._log.info(str(kind), resource=resource, detail=detail)
        self._changed_now()

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, done: Callable[[], bool]) -> None:
        while True:
            changed = self._changed
            if done():
                return
            await changed.wait()

    # -- inspection --------------------------------------------------------------------------

    @property
    def resources(self) -> list[str]:
        """Names of the resources the kubelet knows (connected or not)."""
        return sorted(self._resources)

    @property
    def events(self) -> list[Event]:
        """Every event so far, oldest first."""
        return list(self._events)

    def view(self, name: str) -> ResourceView:
        """A snapshot of one resource; ``KeyError`` when it never registered."""
        return self._resources[name].view()

    def registrations(self, name: str) -> int:
        """How many times ``name`` registered successfully (restarts included)."""
        res = self._resources.get(name)
        return res.registrations if res else 0

    def history(self, name: str) -> list[ListRecord]:
        """Every ListAndWatch list received for ``name``, oldest first."""
        res = self._resources.get(name)
        return list(res.history) if res else []

    def options(self, name: str) -> api_pb2.DevicePluginOptions:
        """The options from ``GetDevicePluginOptions`` (the ones in ``RegisterRequest`` are ignored)."""
        return self._resources[name].options

    def capacity(self, name: str) -> int:
        """Devices listed for ``name``, healthy or not."""
        res = self._resources.get(name)
        return len(res.devices) if res else 0

    def allocatable(self, name: str) -> int:
        """Healthy devices while the stream is connected; 0 once it is disconnected."""
        res = self._resources.get(name)
        return res.view().healthy if res else 0

    def unhealthy(self, name: str) -> int:
        """Devices that count as unhealthy: all of them once the resource is disconnected."""
        return self.capacity(name) - self.allocatable(name)

    async def wait_for_resource(
        self,
        name: str,
        healthy: int | None = None,
        total: int | None = None,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> ResourceView:
        """Wait until ``name`` is registered, streaming, and its latest list matches the counts."""

        def done() -> bool:
            res = self._resources.get(name)
            return (
                res is not None
                and res.connected
                and res.streaming
                and (healthy is None or res.view().healthy == healthy)
                and (total is None or len(res.devices) == total)
            )

        try:
            async with asyncio.timeout(timeout):
                await self._wait_until(done)
            return self._resources[name].view()
        except TimeoutError:
            pass
        res = self._resources.get(name)
        seen = "never registered" if res is None else _describe_resource(res)
        recent = [e for e in self._events if e.resource == name][-5:]
        raise AssertionError(
            f"{name}: wanted healthy={healthy} total={total} within {timeout}s, saw {seen}; "
            f"last events: {recent}"
        )

    async def wait_for_event(
        self,
        kind: EventKind | str | None = None,
        resource: str | None = None,
        *,
        since: int | None = None,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> Event:
        """The first event at index ``since`` or later (default: from now) that matches."""
        start = len(self._events) if since is None else since

        def match() -> Event | None:
            for event in self._events[start:]:
                if (kind is None or event.kind == kind) and (resource is None or event.resource == resource):
                    return event
            return None

        try:
            async with asyncio.timeout(timeout):
                await self._wait_until(lambda: match() is not None)
        except TimeoutError:
            pass
        found = match()
        if found is not None:
            return found
        raise AssertionError(
            f"no {kind or 'event'} for {resource or 'any resource'} within {timeout}s; "
            f"saw {self._events[start:]}"
        )

    # -- driving the plugin ------------------------------------------------------------------

    def stub(self, name: str) -> api_pb2_grpc.DevicePluginAsyncStub:
        """The current connection's DevicePlugin stub, for raw calls."""
        conn = self._resources[name].conn
        if conn is None:
            raise AdmissionError(f"{name}: no plugin connection")
        return conn.stub

    def drop_stream(self, name: str) -> None:
        """Cancel ``name``'s ListAndWatch from the kubelet side; it is never retried."""
        conn = self._resources[name].conn
        if conn is not None:
            conn.drop()

    def release(self, name: str, device_ids: Sequence[str] | None = None) -> None:
        """Free devices as when pods end (the plugin is not told); all of them by default."""
        allocated = self._resources[name].allocated
        if device_ids is None:
            allocated.clear()
        else:
            allocated.difference_update(device_ids)

    async def allocate_ids(
        self,
        name: str,
        device_ids: Sequence[str],
        *,
        timeout: float = 5,  # noqa: ASYNC109
    ) -> api_pb2.AllocateResponse:
        """One raw ``Allocate`` for one container: no checks, no bookkeeping."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        return await self.stub(name).Allocate(request, timeout=timeout)

    async def allocate(
        self,
        name: str,
        count: int = 1,
        device_ids: Sequence[str] | None = None,
        *,
        timeout: float = 5,  # noqa: ASYNC109
    ) -> AllocationResult:
        """Admit one container asking for ``count`` devices, as the kubelet does.

        GetPreferredAllocation first when the options offer it (its answer is advisory: the
        kubelet keeps the available IDs from it and fills up the rest itself), then Allocate,
        then PreStartContainer when ``pre_start_required``. ``device_ids`` picks the devices
        instead (no preferred call). gRPC errors from the plugin propagate as ``AioRpcError``.
        """
        res = self._resources.get(name)
        if res is None or not res.connected or res.conn is None:
            raise AdmissionError(f"device plugin for {name} is not registered or not connected")
        available = [d.id for d in res.devices if d.healthy and d.id not in res.allocated]
        preferred: tuple[str, ...] | None = None
        if device_ids is not None:
            chosen = list(device_ids)
            missing = sorted(set(chosen) - set(available))
            if missing:
                raise AdmissionError(f"{name}: devices {missing} are not available")
        else:
            if len(available) < count:
                raise AdmissionError(
                    f"requested number of devices unavailable for {name}. "
                    f"Requested: {count}, Available: {len(available)}"
                )
            chosen = []
            if res.options.get_preferred_allocation_available:
                preferred = await self._preferred(res.conn, available, count, timeout)
                chosen = [i for i in dict.fromkeys(preferred) if i in available][:count]
            chosen += [i for i in available if i not in chosen][: count - len(chosen)]
        response = await self.allocate_ids(name, chosen, timeout=timeout)
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        res.allocated.update(chosen)
        if res.options.pre_start_required:
            await res.conn.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=chosen), timeout=min(timeout, PRE_START_TIMEOUT)
            )
        return AllocationResult(tuple(chosen), response, preferred, res.options.pre_start_required)

    async def _preferred(
        self, conn: PluginConnection, available: list[str], count: int, deadline: float
    ) -> tuple[str, ...]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=[], allocation_size=count
                )
            ]
        )
        answer = await conn.stub.GetPreferredAllocation(request, timeout=deadline)
        return tuple(i for r in answer.container_responses for i in r.deviceIDs)


def _describe(options: api_pb2.DevicePluginOptions) -> str:
    return (
        f"pre_start_required={options.pre_start_required} "
        f"get_preferred_allocation_available={options.get_preferred_allocation_available}"
    )


def _describe_resource(res: _Resource) -> str:
    state = "streaming" if res.streaming else "connected" if res.connected else "disconnected"
    health = ", ".join(f"{d.id}:{d.health}" for d in res.devices)
    return f"{state}, {res.registrations} registrations, devices [{health}]"
