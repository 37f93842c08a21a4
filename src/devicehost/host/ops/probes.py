"""HTTP for operators, on ``metrics_address``: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``.

Served by aiohttp on the host's own event loop, so an answer from ``/healthz`` also proves the
loop is not blocked. Every answer reads one :class:`~devicehost.host.state.HostState` taken for
that request; readiness and liveness are the snapshot's own :attr:`~HostState.ready` and
:attr:`~HostState.live`, so ``/readyz``, ``/healthz`` and ``/status`` cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.ops.status import document
from devicehost.host.state import HostState


class ProbeServer:
    """The operator endpoints of one host, reading the host through ``snapshot``."""

    def __init__(self, snapshot: Callable[[], HostState], metrics: HostMetrics, address: str) -> None:
        """:param address: ``BIND:PORT``; an empty ``BIND`` listens on every interface."""
        self._snapshot = snapshot
        self._metrics = metrics
        self.bind, _, port = address.rpartition(":")
        self.port = int(port)
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.bind or None, self.port)
        await site.start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        state = self._snapshot()
        if not state.live:
            lines = [
                f"{name}: {', '.join(hooks)} stuck past the hook timeout"
                for name, hooks in state.stuck.items()
            ]
            return web.Response(status=503, text="\n".join(lines) + "\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        state = self._snapshot()
        if not state.ready:
            waiting = ", ".join(sorted(state.waiting)) or "(discovery has not run yet)"
            return web.Response(status=503, text=f"not registered and streaming: {waiting}\n")
        return web.Response(text=f"ok: {len(state.resources)} resources registered\n")

    async def _status(self, _: web.Request) -> web.Response:
        return web.json_response(document(self._snapshot()))
