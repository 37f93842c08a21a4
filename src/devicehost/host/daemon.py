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
from collections.abc import Callable

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import Resource
from devicehost.host import reconcile, reload
from devicehost.host.backends.backend import Backend, HookError
from devicehost.host.backends.backend_set import BackendSet
from devicehost.host.backends.loader import installed_backend_names
from devicehost.host.config import ConfigError, HostConfig
from devicehost.host.serving.registration import Registration
from devicehost.host.serving.resource import ResourceServer, Serving
from devicehost.host.sockets import new_token
from devicehost.host.state import HostState, KubeletState

log = structlog.get_logger(__name__)


def _no_observer(resource: str) -> Callable[[float], None]:
    return lambda seconds: None


class Host:
    """Runs every loaded backend's resources until told to stop."""

    def __init__(
        self,
        config: HostConfig,
        backends: BackendSet,
        registration: Registration,
        *,
        observe_allocation: Callable[[str], Callable[[float], None]] = _no_observer,
        reload_config: Callable[[], HostConfig] | None = None,
    ) -> None:
        self.config = config
        self.backends = backends
        self.resources: dict[str, ResourceServer] = {}
        self.discoveries = 0
        self.stopping = asyncio.Event()
        self._serving = Serving(
            registration, new_token(), config.socket_mode, self.request_rediscovery, observe_allocation
        )
        self._reload_config = reload_config
        self._reload_requested = False
        self._wake = asyncio.Event()

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
        try:
            await self.backends.configure_all(self.config.backends)
            while not self.stopping.is_set():
                self._wake.clear()  # before the work: a request made during it wakes the wait below
                if self._reload_requested:
                    self._reload_requested = False
                    await self._reload()
                await self.reconcile()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.rediscover_interval):
                        await self._wake.wait()
        finally:
            await self.shutdown()
            self.stopping.set()  # also when the loop failed: whoever waits for the stop is told

    async def shutdown(self) -> None:
        """Withdraw every resource (sockets removed, stop hooks called) and close the backends."""
        await asyncio.gather(*(self._withdraw(name) for name in list(self.resources)), return_exceptions=True)
        self.backends.close()

    def snapshot(self) -> HostState:
        """The host's state now, for probes, metrics and ``devicehost status``."""
        watch = self._serving.registration.watch
        return HostState(
            kubelet=KubeletState(str(watch.kubelet_socket), watch.inode is not None),
            backends=self.backends.states(),
            resources=tuple(server.state() for _, server in sorted(self.resources.items())),
            discoveries=self.discoveries,
        )

    async def reconcile(self) -> None:
        """Discover every backend once and bring the served resources in line."""
        self.discoveries += 1
        discovered = await self.backends.discover_all()
        served = {name: server.backend.name for name, server in self.resources.items()}
        plan = reconcile.plan([(b.name, answer) for b, answer in discovered], served)
        for refusal in plan.refused:
            log.error(
                "resource refused",
                backend=refusal.backend,
                resource=refusal.resource,
                problem=refusal.problem,
            )
        for name, devices in plan.update:
            self.resources[name].apply_discovery(devices)
        await asyncio.gather(*(self._withdraw(name) for name in plan.withdraw))
        by_name = {b.name: b for b, _ in discovered}
        await asyncio.gather(*(self._add(by_name[backend], resource) for backend, resource in plan.add))

    async def _add(self, backend: Backend, resource: Resource) -> None:
        server = ResourceServer(backend, resource, self._serving, self.config.health_interval)
        try:
            await server.start()
        except HookError as exc:
            server.log.error("start hook failed, resource not served", error=str(exc))
            return
        except Exception as exc:
            server.log.error("resource could not be served", error=str(exc))
            await server.stop()
            return
        self.resources[resource.name] = server

    async def _withdraw(self, name: str) -> None:
        server = self.resources.pop(name, None)
        if server is not None:
            await server.stop()

    async def _withdraw_backend(self, backend: Backend) -> None:
        await asyncio.gather(
            *(self._withdraw(n) for n, s in list(self.resources.items()) if s.backend is backend)
        )

    async def _reload(self) -> None:
        """Apply a new configuration; resources whose backend and settings stay keep everything."""
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as exc:
            log.error("new configuration refused, keeping the current one", error=str(exc))
            return
        old = self.config
        plan = reload.plan(
            old,
            new,
            installed=await asyncio.to_thread(installed_backend_names),
            loaded=list(self.backends.loaded),
            failed=list(self.backends.failed),
        )
        if plan.deferred:
            log.warning("these settings take effect at the next start", keys=list(plan.deferred))
        self.config = plan.config
        cdi.set_default_dir(self.config.cdi_dir)
        self.backends.set_hook_timeout(self.config.hook_timeout)
        for server in self.resources.values():
            server.health_interval = self.config.health_interval
        for name in plan.disable:
            await self.backends.disable(name, self._withdraw_backend)
        await self.backends.load(plan.load, self.config.backends, self.config.hook_timeout)
        for name in plan.reconfigure:
            await self.backends.reconfigure(name, self.config.backends.get(name, {}))
        log.info("configuration reloaded", changed=list(plan.changed))
