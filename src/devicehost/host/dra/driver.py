"""One DRA driver: its resources' slices, its DRAPlugin socket and registration, its claims.

The driver serves the kubelet's DRAPlugin service on ``<plugins dir>/<driver>/`` and, once that
answers, a registration socket in ``plugins_registry`` (both names unique per host start, so a
rolling update's two hosts never share one). The kubelet's plugin watcher finds the second,
reads the first from it, and calls it to prepare and unprepare claims. The driver's slices are
published only once the kubelet has said it registered the driver (``NotifyRegistrationStatus``):
the scheduler never places a claim the kubelet cannot prepare yet.

During a rolling update two instances serve the driver on one node: the kubelet calls the newer
for new claims and may still call the older until it goes. Either serves any claim (the claims
checkpoint is handed over per call, see :mod:`.checkpoint`), both publish the same pools under
the same slice names, and one that stops while the other's registration socket answers leaves
the slices to it.

Claims are prepared and unprepared by :mod:`.claims`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog

from devicehost.hookspecs.types import Health
from devicehost.host.dra import names
from devicehost.host.dra.allocated import Attached, hold
from devicehost.host.dra.allocations import AllocationWatch
from devicehost.host.dra.binding import BindingWatch
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim
from devicehost.host.dra.claims import Claims
from devicehost.host.dra.claimwatch import ClaimWatch, Follower
from devicehost.host.dra.cluster import Cluster, ClusterError
from devicehost.host.dra.health import HEALTH_SERVICES, DeviceHealth, HealthLists, add_health_services
from devicehost.host.dra.metadata import HOST_DIR, DeviceMetadata
from devicehost.host.dra.publisher import Publisher
from devicehost.host.dra.restore import open_claims, restore_resource
from devicehost.host.dra.servicer import SERVICE, ClaimRef, DraPluginServicer
from devicehost.host.dra.slices import Placement, pool_specs, unhealthy_taint
from devicehost.host.dra.stats import DriverStats
from devicehost.host.inventory import DRA
from devicehost.host.kubelet.plugin_watcher import PluginRegistrationServicer
from devicehost.host.serving.socket import ServedSocket
from devicehost.host.sockets import is_listening, parse_socket_name
from devicehost.proto.dra.v1 import api_pb2_grpc
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from devicehost.resourceapi import UNHEALTHY_TAINT

if TYPE_CHECKING:
    from devicehost.host.context import HostContext
    from devicehost.host.serving.resource import ResourceServer

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
CHECKPOINT_FILE = "devicehost-claims.json"
SERVER_STOP_GRACE = 0.5


@dataclass(frozen=True)
class DraSetup:
    """What every driver of one host start shares; its settings are read in ``context`` when used."""

    context: HostContext
    cluster: Cluster
    token: str

    @property
    def node(self) -> str:
        return self.context.node_name

    @property
    def plugins_dir(self) -> Path:
        return self.context.config.dra_plugins_dir

    @property
    def registry_dir(self) -> Path:
        return self.context.config.plugins_registry_dir

    @property
    def socket_mode(self) -> int:
        return self.context.config.socket_mode

    @property
    def unhealthy_taint(self) -> str | None:
        """The effect of an unhealthy device's taint, where the API keeps taints; "none": withdraw
        it; None: each resource's own choice (``Resource.unhealthy_taint``), else NoSchedule."""
        return self.context.config.dra_unhealthy_taint


class Changes:
    """A version that waiters can follow: each bump wakes them all."""

    def __init__(self) -> None:
        self.version = 0
        self._bumped = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        self._bumped.set()
        self._bumped = asyncio.Event()

    async def wait(self, seen: int) -> int:
        """The version once it differs from ``seen`` (at once for -1)."""
        while self.version == seen:
            await self._bumped.wait()
        return self.version


class DraDriver:
    """Serves one driver name's resources through DRA."""

    def __init__(self, name: str, setup: DraSetup) -> None:
        self.name = name
        self._setup = setup
        self.directory = names.driver_dir(setup.plugins_dir, name)
        self.publisher = Publisher(setup.cluster, setup.node, name, superseded=self._superseded)
        self.resources: dict[str, Attached] = {}
        self.claims = Claims(
            name,
            setup.cluster,
            Checkpoint(self.directory / CHECKPOINT_FILE),
            self.resources,
            setup.context,
        )
        self.metadata = DeviceMetadata(
            name, setup.cluster, self.directory / HOST_DIR, setup.context, self.resources
        )
        self.registered = False
        self.changes = Changes()
        """Bumped whenever a resource's devices change (the kubelet's health stream follows it)."""
        self.log = log.bind(driver=name)
        self._dra_socket = ServedSocket(names.DRA_SOCKET, self.directory, setup.token, setup.socket_mode)
        self._registration_socket = ServedSocket(name, setup.registry_dir, setup.token, setup.socket_mode)
        self._servers: list[grpc.aio.Server] = []
        self._publishing: asyncio.Task[None] | None = None
        self.binding = BindingWatch(name, setup.cluster, self.resources, self.log)
        self.allocations = AllocationWatch(name, setup.cluster, self.resources, self.log)
        followers: dict[str, Follower] = {"binding conditions": self.binding, "allocations": self.allocations}
        self.claim_watch = ClaimWatch(setup.cluster, followers, self.changes.wait, self.log)
        self._tainting: asyncio.Future[bool] | None = None
        self.stats = DriverStats()

    async def start(self, first: ResourceServer) -> None:
        """Restore the claims (:mod:`.restore`) with ``first`` attached, serve DRAPlugin, then the
        registration socket; start publishing. The kubelet learns of the driver only then.

        Raises OSError (what was served so far stopped again) when a socket cannot be served.
        """
        if not self._setup.registry_dir.is_dir():
            raise OSError(
                f"plugins_registry dir {self._setup.registry_dir} does not exist (made by the kubelet)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        open_claims(self.claims)
        await self.attach(first)
        try:
            await self._serve()
        except BaseException:
            self.detach(first.name)
            await self._stop_servers()
            raise
        self._publishing = asyncio.create_task(self.publisher.run(), name=f"publish {self.name}")
        self.claim_watch.start()
        self.log.info(
            "serving DRA", socket=str(self._dra_socket.path), registration=str(self._registration_socket.path)
        )

    async def _serve(self) -> None:
        dra = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DRAPluginServicer_to_server(
            DraPluginServicer(self._prepare, self._unprepare, self.stats.claims), dra
        )
        add_health_services(dra, HealthLists(lambda: device_health(self.resources), self.changes.wait))
        await self._start_server(dra, self._dra_socket)
        registration = registration_server(self.name, lambda: str(self._dra_socket.path), self._on_status)
        await self._start_server(registration, self._registration_socket)

    async def stop(self) -> None:
        """Withdraw every resource and the slices (left to another instance that serves the driver
        here: the same pool), stop serving, remove both sockets."""
        if self._publishing is not None:  # first: only the withdrawal below deletes the slices
            self._publishing.cancel()
            await asyncio.gather(self._publishing, return_exceptions=True)
        await self.claim_watch.stop()
        await self.binding.stop()
        await self.allocations.stop()
        for name in list(self.resources):
            self.detach(name)
        others = other_instances(self._registration_socket.path)
        if others:
            self.log.info("another instance serves the driver here: its ResourceSlices stay", sockets=others)
        else:
            await self.publisher.withdraw_all()
        await self._stop_servers()
        self.log.info("DRA withdrawn")

    async def _stop_servers(self) -> None:
        self._registration_socket.remove()  # first: the kubelet stops calling before the service goes
        for server in reversed(self._servers):
            await server.stop(SERVER_STOP_GRACE)
        self._servers.clear()
        self._dra_socket.remove()

    async def attach(self, server: ResourceServer) -> None:
        """Publish ``server``'s devices and prepare claims for them, its claims restored first."""
        pool = names.pool_name(self._setup.node, server.name)
        slice_name = names.slice_name(self._setup.node, self.name, server.name)
        follow = asyncio.create_task(self._follow(server, pool), name=f"dra {server.name}")
        self.resources[server.name] = Attached(server, pool, slice_name, follow)
        self.allocations.refresh()  # claims allocated its devices before it was attached
        taken = [i for resource, i in self.claims.checkpoint.held() if resource == server.name]
        hold(server, taken, True)  # prepared before a restart too
        await restore_resource(self.claims, server.name)
        await self._restore_metadata(server.name)

    async def _restore_metadata(self, resource: str) -> None:
        """Write again the device metadata specs of the claims restored for ``resource`` (a
        reboot emptied the CDI dir); only opted-in resources have any (their claims read again)."""
        checkpoint, restored = self.claims.checkpoint, self.claims.restored
        mine = {u: c for u, c in checkpoint.claims.items() if u in restored and resource in c.by_resource()}
        answers: dict[str, PreparedClaim | str] = dict(mine)
        for uid, answer in (await self.metadata.add(answers, {})).items():
            if isinstance(answer, str):
                self.log.error("device metadata of a restored claim not written", uid=uid, error=answer)

    async def _prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Prepare the claims, then write the status of those prepared (the device status hook),
        each claim read from the API server once for both (and for the device metadata)."""
        reads = await self.claims.read(claims)
        answers = await self.metadata.add(await self.claims.prepare(claims, reads), reads)
        await self.binding.after_prepare(answers, reads)
        return answers

    async def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare the claims, then remove the device metadata of those unprepared."""
        errors = await self.claims.unprepare(claims)
        self.metadata.remove([uid for uid, error in errors.items() if not error])
        return errors

    def detach(self, resource: str) -> None:
        """Stop publishing ``resource``; its prepared claims stay in the checkpoint."""
        attached = self.resources.pop(resource, None)
        if attached is not None:
            attached.follow.cancel()
            self.publisher.drop_pool(resource)
            self.changes.bump()

    async def _follow(self, server: ResourceServer, pool: str) -> None:
        """Publish the resource's devices now and after every change of its table."""
        if self._tainting is None:  # asked once a driver, before its first slice
            self._tainting = asyncio.ensure_future(taint_effect(self._setup, self.name, self.log))
        effect = resource_taint(self._setup.unhealthy_taint, server, await self._tainting, self.log)
        self.claims.tainted = self.claims.tainted or effect is not None
        await follow(
            server, pool, self._setup.node, self.name, self.publisher, self.changes, effect, self.stats
        )

    async def _start_server(self, server: grpc.aio.Server, socket: ServedSocket) -> None:
        self._servers.append(server)  # stopped on failure too: an unstopped server warns at exit
        try:
            socket.bind(server)
        except RuntimeError as exc:  # grpc's "Failed to bind": say where, as an OSError
            raise OSError(f"cannot serve {socket.path}: {exc}") from None
        await server.start()

    def _superseded(self) -> bool:
        """Whether a newer instance of the driver serves here (a rolling update's new host)."""
        return bool(other_instances(self._registration_socket.path, newer=True))

    def _on_status(self, registered: bool, error: str) -> None:
        self.registered = registered
        if registered:
            self.log.info("registered with the kubelet")
            self.publisher.open()  # publish now (again: a starting kubelet deletes the node's slices)
        else:
            self.log.error("the kubelet refused the driver", error=error)


def device_health(resources: Mapping[str, Attached]) -> list[DeviceHealth]:
    """Every device of a driver's resources with its own health (the kubelet's health stream)."""
    return [
        (attached.pool, names.device_name(d.id), d.health is Health.HEALTHY, d.health_message)
        for attached in resources.values()
        for d in attached.server.table.devices
    ]


def registration_server(
    driver: str, endpoint: Callable[[], str], on_status: Callable[[bool, str], None]
) -> grpc.aio.Server:
    """The plugin watcher's Registration service for ``driver``, whose DRAPlugin is at ``endpoint()``."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    servicer = PluginRegistrationServicer(
        driver, endpoint, on_status, plugin_type=PLUGIN_TYPE, versions=(SERVICE, *HEALTH_SERVICES)
    )
    registration_grpc.add_RegistrationServicer_to_server(servicer, server)
    return server


def other_instances(registration: Path, newer: bool = False) -> list[str]:
    """The registration sockets beside ours (``registration``) of the same driver on which a process
    listens: other instances of it on this node, a rolling update's overlap; with ``newer``, only
    those created after ours."""
    ours = parse_socket_name(registration.name)
    since = _created(registration) if newer else None
    found = []
    for path in sorted(registration.parent.glob("devicehost-*.sock")):
        theirs = parse_socket_name(path.name)
        if not (ours and theirs and path != registration and theirs[0] == ours[0]):
            continue
        if (since is None or _created(path) > since) and is_listening(path):
            found.append(path.name)
    return found


def _created(path: Path) -> float:
    """When the file at ``path`` was made (its ctime; 0 when it is gone)."""
    try:
        return path.lstat().st_ctime
    except FileNotFoundError:
        return 0.0


async def taint_effect(setup: DraSetup, driver: str, log: structlog.typing.FilteringBoundLogger) -> bool:
    """Whether unhealthy devices may stay published with a taint (else they are withdrawn: the
    operator's choice, or an API server that drops device taints), said once."""
    if setup.unhealthy_taint == "none":
        return False
    try:
        kept = await setup.cluster.device_taints(setup.node, driver)
    except ClusterError as exc:
        log.warning("unhealthy devices are withdrawn: the API server's device taints unknown", error=str(exc))
        return False
    if not kept:
        log.info("unhealthy devices are withdrawn: the API server drops device taints (DRADeviceTaints off)")
    return kept


def resource_taint(
    operator: str | None, server: ResourceServer, kept: bool, log: structlog.typing.FilteringBoundLogger
) -> str | None:
    """The effect of the resource's unhealthy devices' taint (None: withdrawn instead): the
    operator's, else the backend's, else NoSchedule, where the API keeps taints; said once."""
    if not kept:
        return None
    effect = operator or server.unhealthy_taint or "NoSchedule"
    log.info("unhealthy devices stay published with a taint" if effect != "none" else "unhealthy devices are withdrawn",
             key=UNHEALTHY_TAINT, resource=server.name, effect=effect)  # fmt: skip
    return None if effect == "none" else effect


async def follow(
    server: ResourceServer,
    pool: str,
    node: str,
    driver: str,
    publisher: Publisher,
    changes: Changes,
    effect: str | None,
    stats: DriverStats,
) -> None:
    """Publish ``server``'s devices now and after every change of its table: one pool of as many
    slices as they need, each device kept in its slice, its counter sets' slice, and with
    ``effect`` its unhealthy devices tainted since they were first seen unhealthy. What the device
    plugin side holds is not offered: those devices and the ones they leave no counters for are
    withdrawn, and the counter sets say what is left."""
    placement = Placement()
    since: dict[str, str] = {}
    seen = -1
    while True:
        if server.table.version != seen:
            seen = server.table.version
            table = server.table
            stats.health((pool, names.device_name(d.id), d.health is Health.HEALTHY) for d in table.devices)
            taints = None
            if effect is not None:
                unhealthy = {d.id for d in table.devices if d.health is not Health.HEALTHY}
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                since = {i: since.get(i, now) for i in unhealthy}
                taints = {i: unhealthy_taint(effect, at) for i, at in since.items()}
            view = table.view()  # the device plugin side's holds: withdrawn, and off the counters
            specs = pool_specs(
                node,
                driver,
                pool,
                table.devices,
                placement,
                view.counter_sets_left(),
                taints,
                view.masked(DRA),
            )
            publisher.want_pool(server.name, names.named_slices(node, driver, server.name, specs))
            changes.bump()
        await server.table.wait_for_change(seen)
