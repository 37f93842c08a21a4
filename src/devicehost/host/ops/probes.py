"""HTTP for operators, on ``metrics_address``: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``.

Served by aiohttp on the host's own event loop, so an answer from ``/healthz`` also proves the
loop is not blocked. It starts before anything else of the host, answering live but not ready
until the host runs. Every answer reads one :class:`~devicehost.host.state.HostState` taken for
that request; readiness and liveness are the snapshot's own :attr:`~HostState.ready` (with
:attr:`~HostState.problems`) and :attr:`~HostState.live`, so ``/readyz``, ``/healthz``,
``/status`` and the metrics cannot disagree. No backend can fail ``/healthz``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.ops.status import document
from devicehost.host.state import HostState


class ProbeServer:
    """The operator endpoints of one host, reading the host through ``snapshot``."""

    def __init__(
        self,
        snapshot: Callable[[], HostState],
        metrics: HostMetrics,
        address: str,
        listener: socket.socket | None = None,
    ) -> None:
        """:param address: ``BIND:PORT``; an empty ``BIND`` listens on every interface.
        :param listener: a socket already listening on ``address`` (bound early), to serve instead.
        """
        self._listener = listener
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
        site: web.BaseSite
        if self._listener is not None:
            site = web.SockSite(self._runner, self._listener)
        else:
            site = web.TCPSite(self._runner, self.bind or None, self.port)
        await site.start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        """Liveness: the host alone (its loop runs; answering proves the event loop is not blocked)."""
        state = self._snapshot()
        if not state.live:
            return web.Response(status=503, text=f"host: {state.loop}\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        """Readiness: every backend loaded and unstuck, every resource registered and streaming."""
        state = self._snapshot()
        if not state.ready:
            return web.Response(status=503, text="not ready:\n" + "".join(f"  {p}\n" for p in state.problems))
        return web.Response(text=f"ok: {len(state.resources)} resources registered\n")

    async def _status(self, _: web.Request) -> web.Response:
        return web.json_response(document(self._snapshot()))
