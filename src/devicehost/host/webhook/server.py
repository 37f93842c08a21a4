"""The webhook's HTTPS server: AdmissionReviews in, decisions out; certificates and backends reloaded.

- ``POST /validate-resource-claim``: an AdmissionReview ``admission.k8s.io/v1``; a body that is
  not one gets HTTP 400 with one line of text.
- ``GET /healthz``: the process answers. ``GET /readyz``: the drivers it checks, once known.
- The certificate and key files are read again when either changes (checked every
  ``cert_check_interval`` seconds: a Secret volume's update swaps a symlink) and on SIGHUP; a pair
  that does not load keeps the previous one.
- SIGHUP also reads the configuration again and loads and discovers the backends anew.
- SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from devicehost.host.config import HostConfig
from devicehost.host.webhook.drivers import DriverTable, build_table
from devicehost.host.webhook.review import Malformed, decide, parse_review, response

log = structlog.get_logger(__name__)

VALIDATE_PATH = "/validate-resource-claim"
MAX_BODY = 3 * 1024 * 1024
"""Bytes; the API server's own request limit."""


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path

    def signature(self) -> tuple[tuple[int, int, int], ...]:
        """What changes when either file is replaced (through a symlink too); zeros while one is missing."""
        found = []
        for path in (self.cert, self.key):
            try:
                st = path.stat()
            except OSError:
                found.append((0, 0, 0))
            else:
                found.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(found)

    def context(self) -> ssl.SSLContext:
        """A server context holding the pair (:raises ssl.SSLError, OSError: when it does not load)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:8443``, ``:8443`` for every interface) as (host, port).

    :raises ValueError: no port, or a port that is not a number from 0 to 65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r}: expected HOST:PORT such as 0.0.0.0:8443")
    return host.strip("[]") or "0.0.0.0", int(port)


class Webhook:
    """The driver table in use, and how to answer and reload."""

    def __init__(
        self,
        config: HostConfig,
        named: Mapping[str, Sequence[str]],
        tls: TlsFiles,
        reload_config: Callable[[], HostConfig],
    ) -> None:
        self.config = config
        self.named = named
        self.tls = tls
        self.reload_config = reload_config
        self.table: DriverTable | None = None
        self.context = tls.context()
        self._tls_seen = tls.signature()
        self.stopping = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None

    async def serve(self, address: str, cert_check_interval: float) -> None:
        """Discover, listen, answer until SIGTERM/SIGINT."""
        host, port = split_address(address)
        self.install_signal_handlers()
        self.table = await build_table(self.config, self.named)
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, ssl_context=self.context)
            await site.start()
            log.info("webhook listening", address=f"{host}:{port}", path=VALIDATE_PATH)
            watch = asyncio.create_task(self.watch_certificate(cert_check_interval))
            try:
                await self.stopping.wait()
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        finally:
            await runner.cleanup()
            if self.table is not None:
                self.table.close()
            log.info("webhook stopped")

    # --- HTTP ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(VALIDATE_PATH, self.validate)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def validate(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            review = parse_review(body)
        except Malformed as exc:
            log.warning("malformed AdmissionReview", error=str(exc), peer=request.remote)
            return web.Response(status=400, text=f"{exc}\n")
        decision = decide(review, self.table.backends if self.table else {})
        where = {
            "kind": review.kind,
            "version": review.version,
            "namespace": review.namespace,
            "name": review.name,
            "operation": review.operation,
            "uid": review.uid,
        }
        if not decision.allowed:
            log.info("claim configuration refused", **where, problems=list(decision.problems))
        elif decision.checked:
            log.debug("claim configuration allowed", **where, drivers=list(decision.checked))
        return web.json_response(response(review.uid, decision))

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _request: web.Request) -> web.Response:
        if self.table is None:
            return web.Response(status=503, text="backends not discovered yet\n")
        return web.json_response({"drivers": self.table.describe(), "problems": list(self.table.problems)})

    # --- reloads -------------------------------------------------------------------------------

    def reload_certificate(self, reason: str) -> None:
        """Load the pair again into the live context; one that does not load keeps the old one."""
        self._tls_seen = self.tls.signature()
        try:
            self.tls.context()  # the whole pair loads, and the key matches, before the live context changes
            self.context.load_cert_chain(self.tls.cert, self.tls.key)
        except (OSError, ssl.SSLError) as exc:
            log.error("certificate not reloaded, keeping the previous one", reason=reason, error=str(exc))
            return
        log.info("certificate reloaded", reason=reason, cert=str(self.tls.cert))

    async def watch_certificate(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.tls.signature() != self._tls_seen:
                await asyncio.sleep(0.2)  # a writer replacing both files: let it finish the second
                self.reload_certificate("files changed")

    async def rediscover(self) -> None:
        """The configuration read again, the backends loaded and discovered anew, then swapped in."""
        try:
            config = self.reload_config()
        except Exception as exc:  # a bad edit keeps what runs
            log.error("configuration not reloaded, keeping the previous one", error=str(exc))
            config = self.config
        try:
            table = await build_table(config, self.named)
        except Exception as exc:  # a backend uninstalled under a running webhook: keep what runs
            log.error("backends not reloaded, keeping the previous ones", error=str(exc))
            return
        old, self.table, self.config = self.table, table, config
        if old is not None:
            old.close()

    def on_sighup(self) -> None:
        log.info("reloading", signal="SIGHUP")
        self.reload_certificate("SIGHUP")
        if self._reloading is None or self._reloading.done():
            self._reloading = asyncio.get_running_loop().create_task(self.rediscover())

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()

        def on_stop(sig: signal.Signals) -> None:
            log.info("stopping", signal=sig.name)
            self.stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self.on_sighup)
