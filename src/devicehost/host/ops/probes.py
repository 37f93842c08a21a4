"""HTTP for operators, on ``metrics_address``: ``/metrics``, ``/healthz``, ``/readyz``, ``/status``.

Served by aiohttp on the host's own event loop, so an answer from ``/healthz`` also proves the
loop is not blocked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from devicehost.host.ops.status import host_status, stuck_hooks

if TYPE_CHECKING:
    from devicehost.host.daemon import Host


class ProbeServer:
    """The operator endpoints of one host."""

    def __init__(self, host: Host, address: str) -> None:
        self._host = host
        self.bind_host, _, port = address.rpartition(":")
        self.port = int(port)
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.bind_host or None, self.port)
        await site.start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self._host.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        stuck = stuck_hooks(self._host)
        if stuck:
            lines = [
                f"{name}: {', '.join(hooks)} stuck past the hook timeout" for name, hooks in stuck.items()
            ]
            return web.Response(status=503, text="\n".join(lines) + "\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        waiting = sorted(name for name, s in self._host.resources.items() if not s.registered)
        if waiting or self._host.discoveries == 0:
            text = "not registered and streaming: " + (", ".join(waiting) or "(discovery has not run yet)")
            return web.Response(status=503, text=text + "\n")
        return web.Response(text=f"ok: {len(self._host.resources)} resources registered\n")

    async def _status(self, _: web.Request) -> web.Response:
        return web.json_response(host_status(self._host))
