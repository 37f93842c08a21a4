"""The host: discover every backend's resources and keep one ResourceServer per resource.

Discovery runs at start, every ``rediscover_interval``, on a reload and when a backend asks for
it. Each round is planned by :func:`devicehost.host.reconcile.plan` and applied here: new
resources are started, served and registered; resources that left discovery are withdrawn; the
device lists of the others are updated in place. Reloads are planned by
:func:`devicehost.host.reload.plan`. The process around the host (signals, probes, the
``kubelet.sock`` watch, the config file watch) belongs to :mod:`devicehost.host.app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog

from devicehost.hookspecs.types import Resource
from devicehost.host import reconcile, reload
from devicehost.host.backends.backend import Backend, HookError
from devicehost.host.backends.backend_set import BackendSet
from devicehost.host.backends.loader import installed_backend_names
from devicehost.host.config import ConfigError, HostConfig
from devicehost.host.dra.drivers import DraDrivers
from devicehost.host.peers import PeerWatch
from devicehost.host.release import tracker_for, with_holders
from devicehost.host.serving.registration import Registration
from devicehost.host.serving.resource import ResourceServer, Serving
from devicehost.host.sockets import new_token
from devicehost.host.state import HostState, KubeletState, ReloadRefusal, ReloadState

if TYPE_CHECKING:
    from devicehost.host.dra.cluster import Cluster

log = structlog.get_logger(__name__)


def _no_observer(resource: str) -> Callable[[float], None]:
    return lambda seconds: None


def _plan_one(
    backend: Backend, answer: Sequence[Resource] | None, backends: BackendSet, served: dict[str, str]
) -> reconcile.Plan:
    """The plan of one backend's answer; the others count as not answering, so they keep theirs."""
    others: list[tuple[str, Sequence[Resource] | None]] = [
        (b.name, None) for b in backends if b is not backend
    ]
    plan = reconcile.plan([(backend.name, answer), *others], served)
    if answer is not None:  # a failed discovery refused nothing new: the last refusals stand
        refused = {r.resource: r.problem for r in plan.refused if r.backend == backend.name}
        for resource, problem in backends.note_refused(backend.name, refused).items():  # once per change
            where = {"backend": backend.name, "hook": "devicehost_discover", "resource": resource}
            log.error("resource refused", **where, problem=problem)
    return plan


def _apply_in_place(config: HostConfig, backends: BackendSet, servers: Iterable[ResourceServer]) -> None:
    """The settings a reload changes without touching any resource's socket or registration."""
    backends.set_cdi_dir(config.cdi_dir)
    backends.set_hook_timeout(config.hook_timeout)
    for server in servers:
        server.health_interval = config.health_interval


async def _started(server: ResourceServer) -> ResourceServer | None:
    """``server`` started, or None when it could not be (logged)."""
    try:
        await server.start()
    except HookError as exc:
        server.log.error("start hook failed, resource not served", error=str(exc))
        return None
    except Exception as exc:
        server.log.error("resource could not be served", error=str(exc))
        await server.stop()
        return None
    return server


class Host:
    """Runs every loaded backend's resources until told to stop."""

    def __init__(
        self,
        config: HostConfig,
        backends: BackendSet,
        registration: Registration,
        *,
        observe_allocation: Callable[[str], Callable[[float], None]] | None = None,
        reload_config: Callable[[], HostConfig] | None = None,
        cluster: Callable[[], Cluster] | None = None,
    ) -> None:
        self.config = config
        self.backends = backends
        self.resources: dict[str, ResourceServer] = {}
        self.discoveries = 0
        self.stopping = asyncio.Event()
        observe = observe_allocation or _no_observer
        policies = config.preferred_allocation
        token, follow = new_token(), config.device_release
        self._serving = Serving(
            registration, token, config.socket_mode, self.request_rediscovery, observe, policies, follow
        )
        self.reload_config = reload_config
        """Reads the configuration again (SIGHUP, a changed file); None: a reload keeps it."""
        self.release = tracker_for(config, lambda: self.resources)
        """Follows the kubelet's pod-resources API; None when ``device_release`` is off."""
        self.dra = DraDrivers(config, self.token, cluster=cluster)
        self._reload_requested = False
        self._wake = asyncio.Event()
        self._loop_state = "starting"
        self.final_state: HostState | None = None
        """The state just before the stop withdrew everything, for the closing summary."""
        self._starting: dict[str, str] = {}
        """Resources whose start is under way, by name: their backend's name."""
        self.reloads = ReloadState()
        """Reloads applied and refused, for ``/status`` and the metrics."""
        self.peers = PeerWatch(registration.directory, self.token, lambda: list(self.resources.values()))
        self._policies_warned: set[str] = set()
        """``preferred_allocation`` names already warned about as served by no backend."""

    @property
    def token(self) -> str:
        """Makes this host start's socket names unique."""
        return self._serving.token

    def request_rediscovery(self) -> None:
        """Run discovery now (thread-unsafe: call on the loop)."""
        self._wake.set()

    def request_reload(self) -> None:
        """Re-read the configuration, then rediscover (SIGHUP, or the config file changed)."""
        self._reload_requested = True
        self._wake.set()

    def request_stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Serve until :meth:`request_stop`; then withdraw every resource."""
        self._loop_state = "running"
        try:
            await self.backends.configure_all(self.config.backends)
            while not self.stopping.is_set():
                self._wake.clear()  # before the work: a request made during it wakes the wait below
                if self._reload_requested:
                    self._reload_requested = False
                    await _reload(self)
                await self.reconcile()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.rediscover_interval):
                        await self._wake.wait()
        finally:
            self._loop_state = "ended"
            await self.shutdown()
            self.stopping.set()  # also when the loop failed: whoever waits for the stop is told

    async def shutdown(self) -> None:
        """Stop the DRA drivers (first: withdrawn from a running driver, a resource's slices go, which
        another instance may serve), withdraw every resource (stop hooks called), close the backends."""
        self.final_state = self.snapshot()
        self.peers.close()
        await self.dra.close()
        await asyncio.gather(*(self._withdraw(name) for name in list(self.resources)), return_exceptions=True)
        self.backends.close()

    def snapshot(self) -> HostState:
        """The host's state now, for probes, metrics and ``devicehost status``."""
        watch = self._serving.registration.watch
        return HostState(
            kubelet=KubeletState(str(watch.kubelet_socket), watch.inode is not None),
            backends=self.backends.states(),
            resources=tuple(
                self.dra.state(with_holders(self.release, s.state()))
                for _, s in sorted(self.resources.items())
            ),
            discoveries=self.discoveries,
            device_release=self.release.status if self.release else "off",
            loop=self._loop_state,
            reloads=self.reloads,
        )

    async def reconcile(self) -> None:
        """Discover every backend at once; each answer is applied as it comes, so a slow backend
        holds back no other backend's resources."""
        self.discoveries += 1
        await asyncio.gather(*(self._reconcile_backend(backend) for backend in self.backends))
        _warn_unserved_policies(self.config.preferred_allocation, self.resources, self._policies_warned)
        self.peers.look()

    async def _reconcile_backend(self, backend: Backend) -> None:
        """Bring ``backend``'s served resources in line with its discovery (the others' are kept)."""
        answer = await self.backends.discover(backend)
        served = {name: server.backend.name for name, server in self.resources.items()} | self._starting
        plan = _plan_one(backend, answer, self.backends, served)
        for resource in plan.update:
            if resource.name in self.resources:
                self.resources[resource.name].apply_discovery(resource)
        await asyncio.gather(*(self._withdraw(name) for name in plan.withdraw))
        for _, resource in plan.add:  # claimed now: a backend answering meanwhile sees them taken
            self._starting[resource.name] = backend.name
        await asyncio.gather(*(self._add(backend, resource) for _, resource in plan.add))

    async def _add(self, backend: Backend, resource: Resource) -> None:
        api = self.dra.api(backend.name, resource)
        server = ResourceServer(
            backend, resource, self._serving, self.config.health_interval, device_plugin=api != "dra"
        )
        try:
            if await _started(server) is None:
                return
            if api != "device-plugin":
                await self.dra.attach(server, api)
        finally:
            self._starting.pop(resource.name, None)
        self.resources[resource.name] = server

    async def _withdraw(self, name: str) -> None:
        server = self.resources.pop(name, None)
        self.dra.detach(name)
        if server is not None:
            await server.stop()

    async def withdraw_backend(self, backend: Backend) -> None:
        """Withdraw every resource of ``backend``."""
        await asyncio.gather(
            *(self._withdraw(n) for n, s in list(self.resources.items()) if s.backend is backend)
        )


def _warn_unserved_policies(policies: Iterable[str], served: Iterable[str], warned: set[str]) -> None:
    """Once per name: ``preferred_allocation`` names a resource no backend serves (a typo, or
    a resource its backend no longer offers), so no policy answers for it."""
    unserved = sorted(set(policies) - set(served) - warned)
    if unserved:
        warned.update(unserved)
        log.warning(
            "preferred_allocation names resources no backend serves; their policy applies to nothing",
            resources=unserved,
            served=sorted(served),
        )


async def _reload(host: Host) -> None:
    """Apply a new configuration; resources whose backend and settings stay keep everything."""
    if host.reload_config is None:
        return
    try:
        new = host.reload_config()
    except ConfigError as exc:
        log.error("new configuration refused, keeping the current one", error=str(exc))
        host.reloads = _counted(host.reloads, [ReloadRefusal(time.time(), "configuration", str(exc))])
        return
    host.reloads = _counted(host.reloads, await _apply_reload(host, new))


def _counted(reloads: ReloadState, refused: Sequence[ReloadRefusal]) -> ReloadState:
    """``reloads`` with one more reload: applied, or refused (the refusals made one)."""
    if not refused:
        return dataclasses.replace(reloads, applied=reloads.applied + 1, latest_refused=False)
    last = ReloadRefusal(refused[0].at, ", ".join(r.what for r in refused), "; ".join(r.why for r in refused))
    return dataclasses.replace(reloads, refused=reloads.refused + 1, last_refused=last, latest_refused=True)


async def _apply_reload(host: Host, new: HostConfig) -> list[ReloadRefusal]:
    """Apply ``new`` as :func:`devicehost.host.reload.plan` says: in place where it can, backends
    disabled, loaded and reconfigured, the rest deferred to the next start (said once).

    :returns: the backends whose new settings were refused (they keep their previous ones).
    """
    backends = host.backends
    installed = await asyncio.to_thread(installed_backend_names)
    plan = reload.plan(
        host.config, new, installed=installed, loaded=list(backends.loaded), failed=list(backends.failed)
    )
    if plan.deferred:
        log.warning("these settings take effect at the next start", keys=list(plan.deferred))
    old = host.config
    host.config = config = plan.config
    _apply_in_place(config, backends, host.resources.values())
    for name in plan.disable:
        await backends.disable(name, host.withdraw_backend)
    await backends.load(plan.load, config.backends, config.hook_timeout)
    refused: list[ReloadRefusal] = []
    for name in plan.reconfigure:
        why = await backends.reconfigure(name, config.backends.get(name, {}))
        if why is not None:
            refused.append(ReloadRefusal(time.time(), f"backends.{name}", why))
    if refused:  # those backends run their previous settings: so does the config the host reports
        kept = dict(config.backends)
        for name in (r.what.removeprefix("backends.") for r in refused):
            if name in old.backends:
                kept[name] = old.backends[name]
            else:
                kept.pop(name, None)
        host.config = config = config.model_copy(update={"backends": kept})
    changed = [key for key in plan.changed if getattr(old, key) != getattr(config, key)]
    log.info(
        "configuration reloaded",
        changed=changed,
        **({"refused": [r.what for r in refused]} if refused else {}),
    )
    return refused
