"""The host: configure backends, discover their resources, keep one ResourceServer per resource.

Discovery runs at start, every ``rediscover_interval``, on SIGHUP and when a backend asks for
it. Each run reconciles: new resources are started, served and registered; resources that
left discovery are withdrawn; the device lists of the others are updated in place. A backend
whose discovery fails keeps what it had; a resource that breaks the kubelet's rules is refused
with the rule named, and the rest go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Resource
from devicehost.host.backends.backend import Backend, HookError
from devicehost.host.backends.loader import enabled_backend_names, load_backends
from devicehost.host.config import ConfigError, HostConfig
from devicehost.host.config_watch import watch_config_file
from devicehost.host.kubelet.client import KubeletClient
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.serving.resource import ResourceServer
from devicehost.host.sockets import new_token, remove_stale

if TYPE_CHECKING:
    from devicehost.host.ops.probes import ProbeServer

log = structlog.get_logger(__name__)

RESTART_KEYS = (
    "device_plugins_dir",
    "allow_symlinked_dirs",
    "plugins_registry_dir",
    "registration_mode",
    "metrics_address",
    "socket_mode",
    "log_format",
    "log_level",
)
"""Settings a reload cannot change: the sockets, servers and log renderer already in use."""

HELPER_STOP_TIMEOUT = 2.0
"""Seconds shutdown waits for the watcher tasks after cancelling them; it never hangs on them."""

DEPRECATION_FILE = "DEPRECATION"
"""Written by kubelets that register device plugins through the plugin watcher."""


class Host:
    """Runs every loaded backend's resources until told to stop."""

    def __init__(
        self,
        config: HostConfig,
        backends: Sequence[Backend],
        reload_config: Callable[[], HostConfig] | None = None,
        failed_backends: Mapping[str, str] | None = None,
        config_file: Path | None = None,
    ) -> None:
        self.config = config
        self.backends = {b.name: b for b in backends}
        self.failed_backends: dict[str, str] = dict(failed_backends or {})
        """Backends that did not load or whose settings were refused, with the reason."""
        self.resources: dict[str, ResourceServer] = {}
        self.token = new_token()
        self.watcher = KubeletSocketWatch(config.device_plugins_dir)
        self._reload_config = reload_config
        self._config_file = config_file
        self._client = KubeletClient(self.watcher, config.register_timeout)
        self._configured: set[str] = set()
        self._wake = asyncio.Event()
        self._reload_requested = False
        self.stopping = asyncio.Event()
        self.discoveries = 0
        self.metrics = HostMetrics()
        self.metrics.watch(self)

    def request_rediscovery(self) -> None:
        """Run discovery now (thread-unsafe: call on the loop)."""
        self._wake.set()

    def request_reload(self) -> None:
        """Re-read the configuration, then rediscover (SIGHUP)."""
        self._reload_requested = True
        self._wake.set()

    def request_stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Serve until :meth:`request_stop`; then withdraw every resource."""
        removed = remove_stale(self.config.device_plugins_dir)
        if self.config.plugins_registry_dir.is_dir():
            removed += remove_stale(self.config.plugins_registry_dir)
        if removed:
            log.info("removed stale sockets of an earlier host", sockets=removed)
        cdi.set_default_dir(self.config.cdi_dir)
        probes = await self._start_probes()
        watch = asyncio.create_task(self.watcher.run(), name="kubelet watcher")
        follow = (
            asyncio.create_task(
                watch_config_file(self._config_file, self.request_reload), name="config watcher"
            )
            if self._config_file is not None and self._reload_config is not None
            else None
        )
        try:
            await self._configure_all()
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
            helpers = [task for task in (watch, follow) if task is not None]
            for task in helpers:
                task.cancel()
            await asyncio.wait(helpers, timeout=HELPER_STOP_TIMEOUT)  # never swallows our own cancel
            if probes is not None:
                await probes.stop()

    async def _start_probes(self) -> ProbeServer | None:
        """Serve /metrics, /healthz, /readyz and /status when metrics_address is set."""
        if not self.config.metrics_address:
            return None
        from devicehost.host.ops.probes import ProbeServer

        probes = ProbeServer(self, self.config.metrics_address)
        await probes.start()
        log.info("serving metrics and probes", address=self.config.metrics_address)
        return probes

    async def shutdown(self) -> None:
        """Withdraw every resource (sockets removed, stop hooks called) and close the backends."""
        servers = list(self.resources.values())
        self.resources.clear()
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        await self._client.close()
        for backend in self.backends.values():
            backend.close()

    async def _configure_all(self) -> None:
        for name, backend in list(self.backends.items()):
            if not await self._configure(backend):
                del self.backends[name]

    async def _configure(self, backend: Backend) -> bool:
        settings = self.config.backends.get(backend.name, {})
        if not backend.implements("devicehost_configure"):
            return True
        try:
            await backend.configure(settings)
        except HookError as exc:
            log.error("backend settings refused", backend=backend.name, error=str(exc))
            self.failed_backends[backend.name] = f"settings refused: {exc}"
            return False
        return True

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
        fixed = {key: getattr(old, key) for key in RESTART_KEYS if getattr(old, key) != getattr(new, key)}
        if fixed:
            log.warning("these settings take effect at the next start", keys=sorted(fixed))
            new = new.model_copy(update=fixed)
        self.config = new
        cdi.set_default_dir(new.cdi_dir)
        for backend in self.backends.values():
            backend.hook_timeout = new.hook_timeout
        for server in self.resources.values():
            server.health_interval = new.health_interval
        await self._apply_backend_set(old, new)
        for backend in list(self.backends.values()):
            if old.backends.get(backend.name) != new.backends.get(backend.name):
                try:
                    await backend.configure(new.backends.get(backend.name, {}))
                except HookError as exc:
                    log.error(
                        "new settings refused, the backend keeps its previous ones",
                        backend=backend.name,
                        error=str(exc),
                    )
        changed = sorted(k for k in HostConfig.model_fields if getattr(old, k) != getattr(new, k))
        log.info("configuration reloaded", changed=changed)

    async def _apply_backend_set(self, old: HostConfig, new: HostConfig) -> None:
        """Withdraw backends no longer enabled; load the newly enabled ones (and retry failed ones)."""
        wanted = enabled_backend_names(new.enabled_backends, new.disabled_backends)
        for name in [n for n in self.backends if n not in wanted]:
            backend = self.backends.pop(name)
            await asyncio.gather(
                *(self._withdraw(s) for s in list(self.resources.values()) if s.backend is backend)
            )
            backend.close()
            log.info("backend disabled", backend=name)
        previously = enabled_backend_names(old.enabled_backends, old.disabled_backends)
        to_load = [
            name
            for name in wanted
            if name not in self.backends
            and (
                name not in previously
                or (name in self.failed_backends and old.backends.get(name) != new.backends.get(name))
            )
        ]
        if not to_load:
            return

        for status in await asyncio.to_thread(load_backends, to_load, [], new.hook_timeout):
            if status.backend is None:
                self.failed_backends[status.name] = status.error or "failed to load"
                continue
            self.failed_backends.pop(status.name, None)
            if await self._configure(status.backend):
                self.backends[status.name] = status.backend
                log.info("backend enabled", backend=status.name)

    async def reconcile(self) -> None:
        """Discover every backend once and bring the served resources in line."""
        self.discoveries += 1
        backends = list(self.backends.values())
        answers = await asyncio.gather(*(self._discover(b) for b in backends))
        wanted: dict[str, tuple[Backend, Resource]] = {}
        failed: set[str] = set()
        for backend, resources in zip(backends, answers, strict=True):
            if resources is None:
                failed.add(backend.name)
                continue
            for resource in resources:
                if self._acceptable(backend, resource, wanted):
                    wanted[resource.name] = (backend, resource)
        stale = [
            server
            for name, server in self.resources.items()
            if name not in wanted and server.backend.name not in failed
        ]
        fresh = [(b, r) for name, (b, r) in wanted.items() if name not in self.resources]
        for name, (_, resource) in wanted.items():
            if name in self.resources:
                self.resources[name].apply_discovery(resource.devices)
        await asyncio.gather(*(self._withdraw(server) for server in stale))
        await asyncio.gather(*(self._add(backend, resource) for backend, resource in fresh))

    async def _discover(self, backend: Backend) -> list[Resource] | None:
        try:
            return await backend.discover()
        except HookError as exc:
            log.error(
                "discovery failed, keeping this backend's resources as they are",
                backend=backend.name,
                error=str(exc),
            )
            return None

    def _acceptable(
        self, backend: Backend, resource: Resource, wanted: dict[str, tuple[Backend, Resource]]
    ) -> bool:
        problem = (
            rules.resource_name_problem(resource.name)
            if isinstance(resource.name, str)
            else "name is not a string"
        )
        if problem is None:
            problem = rules.device_ids_problem(d.id for d in resource.devices)
        if problem is None and resource.name in wanted:
            problem = (
                f"resource {resource.name!r} is already offered by backend {wanted[resource.name][0].name!r}"
            )
        current = self.resources.get(resource.name)
        if problem is None and current is not None and current.backend is not backend:
            problem = f"resource {resource.name!r} is already served for backend {current.backend.name!r}"
        if problem is None:
            return True
        log.error(
            "resource refused", backend=backend.name, resource=str(resource.name)[:300], problem=problem
        )
        if current is not None and current.backend is backend:
            wanted[resource.name] = (backend, Resource(resource.name, current.table.devices))
        return False

    async def _add(self, backend: Backend, resource: Resource) -> None:
        server = ResourceServer(
            backend,
            resource,
            directory=self.config.device_plugins_dir,
            token=self.token,
            socket_mode=self.config.socket_mode,
            health_interval=self.config.health_interval,
            watcher=self.watcher,
            client=self._client,
            request_rediscovery=self.request_rediscovery,
            observe_allocation=self.metrics.allocation_seconds.labels(resource.name).observe,
            registry_dir=self._registry_dir(),
        )
        try:
            await server.start()
        except HookError as exc:
            log.error(
                "start hook failed, resource not served",
                backend=backend.name,
                resource=resource.name,
                error=str(exc),
            )
            return
        except Exception as exc:
            log.error(
                "resource could not be served", backend=backend.name, resource=resource.name, error=str(exc)
            )
            await server.stop()
            return
        self.resources[resource.name] = server

    def _registry_dir(self) -> Path | None:
        """The plugins_registry dir when resources register through the kubelet's plugin watcher."""
        mode = self.config.registration_mode
        if mode == "auto":
            deprecation = self.config.device_plugins_dir / DEPRECATION_FILE
            mode = (
                "watcher" if deprecation.exists() and self.config.plugins_registry_dir.is_dir() else "kubelet"
            )
        return self.config.plugins_registry_dir if mode == "watcher" else None

    async def _withdraw(self, server: ResourceServer) -> None:
        self.resources.pop(server.name, None)
        await server.stop()


def install_signal_handlers(host: Host, on_forced_exit: Callable[[], None]) -> None:
    """SIGTERM/SIGINT stop the host (a second one forces the exit); SIGHUP reloads."""
    loop = asyncio.get_running_loop()

    def on_stop(sig: signal.Signals) -> None:
        if host.stopping.is_set():
            log.error("second signal, exiting without cleaning up", signal=sig.name)
            on_forced_exit()
        log.info("stopping", signal=sig.name)
        host.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, host.request_reload)
