"""The composition root: builds a host and everything around it, and owns the process lifecycle.

:func:`compose` is the one place that builds every long-lived part of a host start (the
``kubelet.sock`` watch, the Register client, the registration, the backend set, the resource
serving, the release tracker, the DRA drivers, the peer watch) and hands each what it needs,
the :class:`~devicehost.host.context.HostContext` above all: parts read their settings there
when they use them, so a reload reaches them all. :func:`running` starts, in order, the metrics
and probe endpoints, the ``kubelet.sock`` watch, the release tracker, the config file watch and
the host's loop, and tears them down in reverse in one place. :func:`run_host` adds the signals: SIGTERM and SIGINT stop the host (a second one
exits at once), SIGHUP reloads. :func:`run_process` runs it on a new event loop and leaves the
process as soon as it is done. ``devicehost run`` and ``run --simulate-kubelet`` both go through
:func:`run_process` and :func:`run_host`; the test kit and the benchmarks use :func:`running`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import structlog

from devicehost.host.backends.backend import Backend
from devicehost.host.backends.backend_set import BackendSet
from devicehost.host.config import HostConfig
from devicehost.host.config_watch import watch_config_file
from devicehost.host.context import HostContext
from devicehost.host.daemon import Host, HostParts
from devicehost.host.dra.drivers import DraDrivers
from devicehost.host.kubelet.client import KubeletClient
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.host.logs import drain_native_stderr
from devicehost.host.peers import PeerWatch
from devicehost.host.release import tracker_for
from devicehost.host.serving.mode import for_mode
from devicehost.host.serving.resource import ResourceServer, Serving
from devicehost.host.sockets import new_token, remove_stale
from devicehost.host.state import STARTING, HostState

if TYPE_CHECKING:
    from devicehost.host.dra.cluster import Cluster
    from devicehost.host.ops.metrics import HostMetrics

log = structlog.get_logger(__name__)

HELPER_STOP_TIMEOUT = 2.0
"""Seconds teardown waits for a helper task after cancelling it; it never hangs on one."""
EXIT_OK = 0
EXIT_FORCED = 1


@contextlib.asynccontextmanager
async def running(
    config: HostConfig,
    backends: Sequence[Backend],
    *,
    failed_backends: Mapping[str, str] | None = None,
    reload_config: Callable[[], HostConfig] | None = None,
    config_file: Path | None = None,
    cluster: Callable[[], Cluster] | None = None,
    metrics_listener: socket.socket | None = None,
) -> AsyncIterator[Host]:
    """A host serving ``backends`` with everything around it, until the block ends.

    The probe endpoints start first, answering live but not ready until the host runs.
    ``cluster`` makes the API server client of DRA; unset: the real one from the config.
    ``metrics_listener``: a socket already listening on ``metrics_address`` (bound before the
    slow part of the start) for the probes to serve; unset: they bind it themselves.
    """
    host: Host | None = None

    def snapshot() -> HostState:
        return STARTING if host is None else host.snapshot()

    metrics = _metrics() if config.metrics_address else None
    async with contextlib.AsyncExitStack() as stack:
        if metrics is not None:
            metrics.watch(snapshot)
            await _serve_probes(stack, snapshot, metrics, config.metrics_address, metrics_listener)
        _remove_stale_sockets(config)
        context = HostContext(config)
        observe = None if metrics is None else metrics.observer
        parts, watch, client = compose(context, backends, failed_backends, observe, cluster)
        stack.push_async_callback(client.close)
        host = Host(parts, reload_config)
        await stack.enter_async_context(_helper(watch.run(), "kubelet socket watch"))
        if host.release is not None:
            await stack.enter_async_context(_helper(host.release.run(), "pod-resources watch"))
        if config_file is not None and reload_config is not None:
            follow = watch_config_file(config_file, host.request_reload)
            await stack.enter_async_context(_helper(follow, "config file watch"))
        loop = asyncio.create_task(host.run(), name="devicehost host")
        try:
            yield host
        finally:
            host.request_stop()
            await loop


def compose(
    context: HostContext,
    backends: Sequence[Backend],
    failed_backends: Mapping[str, str] | None,
    observe_allocation: Callable[[str], Callable[[float], None]] | None,
    cluster: Callable[[], Cluster] | None,
) -> tuple[HostParts, KubeletSocketWatch, KubeletClient]:
    """Every long-lived part of one host start, each built once and handed what it needs; the
    ``kubelet.sock`` watch and the Register client are returned for :func:`running` to run and close.

    ``cluster`` makes DRA's API server client (unset: the real one, from the config).
    """
    config = context.config
    watch = KubeletSocketWatch(config.device_plugins_dir)
    client = KubeletClient(watch, lambda: context.config.register_timeout)
    registration = for_mode(
        config.registration_mode, config.device_plugins_dir, config.plugins_registry_dir, watch, client
    )
    resources: dict[str, ResourceServer] = {}
    wake = asyncio.Event()
    observe = observe_allocation or _no_observer
    serving = Serving(context, registration, new_token(), wake.set, observe, config.device_release)
    release = tracker_for(config, lambda: resources)
    if release is not None:  # the checkpoint file's changes are its trigger to look
        watch.subscribe(release.poke)
    dra = DraDrivers(context, serving.token, cluster=cluster)
    peers = PeerWatch(registration.directory, serving.token, lambda: list(resources.values()))
    watch.subscribe(peers.on_dir_change)  # another host's sockets come and go in this dir
    backend_set = BackendSet(backends, failed_backends, context)
    return HostParts(context, backend_set, serving, resources, wake, dra, peers, release), watch, client


def _no_observer(resource: str) -> Callable[[float], None]:
    return lambda seconds: None


async def run_host(
    config: HostConfig,
    backends: Sequence[Backend],
    *,
    failed_backends: Mapping[str, str] | None = None,
    reload_config: Callable[[], HostConfig] | None = None,
    config_file: Path | None = None,
    on_start: Callable[[Host], None] | None = None,
    cluster: Callable[[], Cluster] | None = None,
    metrics_listener: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (a second signal exits at once with status 1); SIGHUP reloads.

    ``on_start`` sees the host before it serves; ``cluster`` makes DRA's API server client (unset:
    the real one). Returns after every resource is withdrawn and every helper stopped, having
    logged one ``stopped`` line that sums up the run.
    """
    started = time.monotonic()
    async with running(
        config,
        backends,
        failed_backends=failed_backends,
        reload_config=reload_config,
        config_file=config_file,
        cluster=cluster,
        metrics_listener=metrics_listener,
    ) as host:
        if on_start is not None:
            on_start(host)
        install_signal_handlers(host, lambda: exit_now(EXIT_FORCED))
        await host.stopping.wait()
    log.info("stopped", **stop_summary(host.final_state, time.monotonic() - started))


def stop_summary(state: HostState | None, seconds: float) -> dict[str, object]:
    """What the closing ``stopped`` line says about the run: what was served, and for how long."""
    resources = state.resources if state is not None else ()
    return {
        "uptime_s": round(seconds, 1),
        "backends": [b.name for b in state.backends if b.loaded] if state is not None else [],
        "resources": len(resources),
        "devices": sum(r.device_count for r in resources),
        "registrations": sum(r.registration_count for r in resources),
        "allocations": sum(r.allocations for r in resources),
    }


def run_process(serve: Callable[[], Awaitable[None]]) -> NoReturn:
    """Run ``serve()`` on a new event loop, then leave the process at once with status 0."""

    async def serve_then_leave() -> None:
        await serve()
        exit_now(EXIT_OK)  # from inside the loop: asyncio.run's teardown would wait on stray threads

    gc.freeze()  # what the imports built lives as long as the process: no collection walks it again
    asyncio.run(serve_then_leave())
    raise AssertionError("exit_now returned")  # pragma: no cover - exit_now never returns


def exit_now(code: int) -> NoReturn:
    """Leave once every socket is removed and every stop hook has run.

    Hook threads that never returned, and grpc's own teardown at interpreter exit, must not keep
    the pod in Terminating after the host has cleaned up.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away loses the tail
            stream.flush()
    drain_native_stderr()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(code)


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


def _remove_stale_sockets(config: HostConfig) -> None:
    removed = remove_stale(config.device_plugins_dir)
    if config.plugins_registry_dir.is_dir():
        removed += remove_stale(config.plugins_registry_dir)
    if removed:
        log.info("removed stale sockets of an earlier host", sockets=removed)


def _metrics() -> HostMetrics:
    """The metrics registry, only when something serves it (prometheus_client is imported here)."""
    from devicehost.host.ops.metrics import HostMetrics

    return HostMetrics()


async def _serve_probes(
    stack: contextlib.AsyncExitStack,
    snapshot: Callable[[], HostState],
    metrics: HostMetrics,
    address: str,
    listener: socket.socket | None,
) -> None:
    """Serve /metrics, /healthz, /readyz and /status (aiohttp is imported only when asked for)."""
    from devicehost.host.ops.probes import ProbeServer

    probes = ProbeServer(snapshot, metrics, address, listener)
    await probes.start()
    stack.push_async_callback(probes.stop)
    log.info("serving metrics and probes", address=address)


@contextlib.asynccontextmanager
async def _helper(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """Run ``work`` as a task for the life of the block; cancel it at the end, waiting briefly."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=HELPER_STOP_TIMEOUT)  # never swallows our own cancel
