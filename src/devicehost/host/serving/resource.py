"""One resource's life: started by its backend, served on its own socket, kept registered.

A :class:`ResourceServer` composes the parts of one resource: its device table, its
DevicePlugin servicer, its socket, its ListAndWatch streams and its registrar (which keeps it
registered, :mod:`~devicehost.host.serving.registration`), plus the backend's health poll. A
resource served through DRA only (:mod:`devicehost.host.dra`) keeps the table, the start and stop
hooks and the health poll, and serves no DevicePlugin socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Device, Health, Resource
from devicehost.host.backends.backend import Backend, HookError
from devicehost.host.inventory import DEVICE_PLUGIN, DRA
from devicehost.host.serving.notifier import Notifier
from devicehost.host.serving.registration import Registrar, Registration
from devicehost.host.serving.servicer import DevicePluginServicer
from devicehost.host.serving.socket import ServedSocket
from devicehost.host.serving.streams import StreamSet
from devicehost.host.serving.table import DeviceTable
from devicehost.host.state import ResourceState
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from devicehost.host.context import HostContext

log = structlog.get_logger(__name__)

SERVER_STOP_GRACE = 0.5


@dataclass(frozen=True)
class Serving:
    """What the resources of one host start share."""

    context: HostContext
    """Where a resource reads its settings when it uses them (socket mode, health interval, policy)."""
    registration: Registration
    token: str
    """Makes this host start's socket names unique (rolling updates overlap two hosts)."""
    request_rediscovery: Callable[[], None]
    observe_allocation: Callable[[str], Callable[[float], None]]
    """The allocation latency observer of a resource, by resource name."""
    pods_followed: bool = False
    """Whether the kubelet's pod-resources API is followed (``device_release``): see
    :attr:`~devicehost.host.inventory.Inventory.pods_followed`."""


class ResourceServer:
    """Serves and registers one resource of one backend."""

    def __init__(
        self,
        backend: Backend,
        resource: Resource,
        serving: Serving,
        device_plugin: bool = True,
    ) -> None:
        self.backend = backend
        self.device_plugin = device_plugin  # False: served through DRA only
        self.name = resource.name
        self.context = serving.context
        """Where it reads its settings when it uses them (socket mode, policy, health interval)."""
        self.table = DeviceTable(resource.devices, resource.counter_sets)
        self.table.inventory.pods_followed = serving.pods_followed
        self.unhealthy_taint = resource.unhealthy_taint
        """DRA: the backend's choice of an unhealthy device's taint effect (read when published)."""
        self.device_metadata = resource.device_metadata  # DRA: write device metadata for containers
        self._discovered_health = {d.id: d.health for d in resource.devices}
        self.log = log.bind(resource=self.name, backend=backend.name)
        self.socket = ServedSocket(
            self.name, serving.registration.directory, serving.token, self.context.config.socket_mode
        )
        self.streams = StreamSet(self.table, lambda epoch: self.registrar.stream_lost(epoch))
        self.servicer = DevicePluginServicer(
            backend,
            self.name,
            self.table,
            self.streams,
            serving.observe_allocation(self.name),
            self.context.config.preferred_allocation.get(self.name, "none"),
        )
        self.registrar: Registrar = serving.registration.registrar(self)
        self._request_rediscovery = serving.request_rediscovery
        self._notifier = Notifier(
            asyncio.get_running_loop(),
            on_health=lambda health: self.apply_health(health, "notifier.set_health"),
            on_devices=lambda devices: self.apply_devices(devices, "notifier.set_devices"),
            on_rediscover=serving.request_rediscovery,
        )
        self._server: grpc.aio.Server | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.superseded_by = ""  # another host's newer registration of it (``host/peers.py``)

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        return self.servicer.options

    async def start(self) -> None:
        """Call the backend's start hook, serve the socket, and begin registering."""
        with structlog.contextvars.bound_contextvars(resource=self.name, backend=self.backend.name):
            await self.backend.start(self.name, self._notifier)
            if self.device_plugin:
                await self._serve()
                self.registrar.start()
            if self.backend.implements("devicehost_health"):
                self._health_task = asyncio.create_task(self._poll_health(), name=f"health {self.name}")

    async def stop(self) -> None:
        """Withdraw: stop registering, end streams, stop serving, remove the socket, call stop."""
        self._notifier.close()
        await self.registrar.stop()
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        await self._stop_server()
        try:
            await self.backend.stop(self.name)
        except HookError as exc:
            self.log.error("stop hook failed", error=str(exc))
        self.log.info("withdrawn")

    async def serve_again(self) -> None:
        """Stop serving and serve a fresh socket (the kubelet removed ours, or lost it)."""
        await self._stop_server()
        await self._serve()

    def state(self) -> ResourceState:
        devices = self.table.advertised()
        return ResourceState(
            name=self.name,
            backend=self.backend.name,
            socket=str(self.socket.path) if self.device_plugin else "",
            registered=self.registrar.registered and not self.superseded_by,
            superseded_by=self.superseded_by,
            streams=self.streams.count,
            devices={h.value: sum(d.health is h for d in devices) for h in Health},
            registrations=dict(self.registrar.stats.reasons),
            updates_sent=self.servicer.updates_sent,
            allocations=self.servicer.allocations,
            errors=dict(self.servicer.errors),
            releasing=tuple(sorted(self.table.releasing)),
            failed_tries=self.registrar.stats.failed_tries,
            hook_timeouts=self.backend.resource_timeouts(self.name),
            masked=masked_state(self.table),
        )

    def apply_discovery(self, resource: Resource) -> None:
        """Take the rediscovered resource: its counter sets, and its devices, whose health counts
        only where discovery's view changed.

        Health also arrives pushed (notifier) and polled (health hook): a discovery that reports
        the same health for a device as last time says nothing new, so it must not undo a newer
        pushed or polled state. Every source reports changes, and the latest change wins.
        """
        self.table.set_counter_sets(resource.counter_sets)
        self.device_metadata = resource.device_metadata
        merged = keep_newer_health(self.table.devices, self._discovered_health, resource.devices)
        self._discovered_health = {d.id: d.health for d in resource.devices}
        self.apply_devices(merged)

    def apply_devices(self, devices: tuple[Device, ...], source: str = "devicehost_discover") -> None:
        """Take a new device list from discovery or the backend's notifier, if it is valid.

        A list that breaks a rule is refused as a whole: the resource keeps its last good list.
        """
        problem = rules.devices_problem(devices)
        if problem:
            self.log.error("device list refused, keeping the previous one", hook=source, problem=problem)
            return
        if self.table.replace(devices):
            self.log.info("devices changed", devices=len(devices), healthy=self.table.healthy_count())

    def apply_health(self, health: Mapping[str, Any], source: str = "devicehost_health") -> None:
        """Take health values from the backend's notifier or health hook, if every one is valid."""
        problem = rules.health_problem(health)
        if problem:
            self.log.error("health update refused", hook=source, problem=problem)
            return
        if self.table.set_health(health):
            self.log.info(
                "health changed", healthy=self.table.healthy_count(), devices=len(self.table.devices)
            )

    def supersede(self, socket: str, present: Collection[str]) -> None:
        """Another host's ``socket`` registered this resource after us (empty: none now); when the
        one that did is gone from the dir (not in ``present``), the kubelet dropped the resource
        with its stream, so register again."""
        was, self.superseded_by = self.superseded_by, socket
        if socket and socket != was:
            self.log.warning("superseded: another host registered this resource after us", socket=socket)
        elif was and not socket and was not in present:
            self.log.info("the host that superseded this resource left; registering again", socket=was)
            self.registrar.stream_lost(self.streams.epoch)

    async def _poll_health(self) -> None:
        """Ask the backend's health hook every ``health_interval`` (a reload's new one counts at
        once) and apply what it answers."""
        while True:
            await self.context.sleep(lambda config: config.health_interval)
            try:
                health = await self.backend.health(self.name, self.table.devices)
            except HookError as exc:
                self.log.error("health hook failed", error=str(exc))
                continue
            self.apply_health(health)

    async def _serve(self) -> None:
        """Start a gRPC server on a fresh socket file."""
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        self.registrar.prepare(server)
        self.socket.bind(server)
        await server.start()
        self._server = server
        self.log.info("serving", socket=str(self.socket.path))

    async def _stop_server(self) -> None:
        await self.streams.end_all()
        if self._server is not None:
            await self._server.stop(SERVER_STOP_GRACE)
            self._server = None
        self.socket.remove()


def masked_state(table: DeviceTable) -> dict[str, tuple[str, ...]]:
    """The devices each API must not give out because of the other's holds, sorted; only the
    sides that mask something."""
    view = table.view()
    masked = {side: tuple(sorted(view.masked(side))) for side in (DEVICE_PLUGIN, DRA)}
    return {side: ids for side, ids in masked.items() if ids}


def keep_newer_health(
    current: Sequence[Device], discovered: Mapping[str, Health], devices: Sequence[Device]
) -> tuple[Device, ...]:
    """``devices`` as rediscovered, each with its current health where discovery reports the
    same health as it did last time (``discovered``): that says nothing new."""
    now = {d.id: d for d in current}
    return tuple(
        replace(d, health=now[d.id].health) if d.id in now and discovered.get(d.id) == d.health else d
        for d in devices
    )
