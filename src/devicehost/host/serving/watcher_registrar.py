"""Registration through the kubelet's plugin watcher: a socket in ``plugins_registry``.

The resource's socket itself lives in ``plugins_registry`` and serves
``pluginregistration.Registration`` next to DevicePlugin. The kubelet's plugin watcher finds it,
registers it and reports the outcome; the registrar only serves the socket again when the
kubelet lost it (the socket was removed, the stream dropped, or the registration was refused).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from devicehost.host.kubelet.plugin_watcher import PluginRegistrationServicer
from devicehost.host.serving.registration import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    Backoff,
    Endpoint,
    RegistrarLoop,
    SocketWatch,
)
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

REREGISTER_WAIT = 1.0
"""Seconds a resource waits, after its stream drops, for the kubelet to register it again by
itself (a restarted kubelet walks plugins_registry) before it serves a new socket."""


@dataclass
class PluginWatcherRegistration:
    """Every resource serves its socket in ``plugins_registry`` for the kubelet to find."""

    directory: Path
    watch: SocketWatch

    def registrar(self, endpoint: Endpoint) -> PluginWatcherRegistrar:
        return PluginWatcherRegistrar(endpoint, self.watch)


class PluginWatcherRegistrar(RegistrarLoop):
    """Serves one resource's socket again whenever the kubelet's plugin watcher lost it."""

    def __init__(self, endpoint: Endpoint, watch: SocketWatch) -> None:
        super().__init__(endpoint, watch)
        self._status: tuple[bool, str] | None = None
        """The kubelet's last NotifyRegistrationStatus for the socket served now."""
        self._served_at = 0.0
        self._backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)

    @property
    def registered(self) -> bool:
        return self._status is not None and self._status[0] and self._endpoint.streams.count > 0

    def prepare(self, server: grpc.aio.Server) -> None:
        """Serve ``Registration`` on the resource's socket, for the kubelet's plugin watcher."""
        endpoint = self._endpoint
        registration = PluginRegistrationServicer(
            endpoint.name, lambda: str(endpoint.socket.path), self._on_status
        )
        registration_grpc.add_RegistrationServicer_to_server(registration, server)
        self._status = None
        self._served_at = time.monotonic()

    def _on_dir_change(self, changed: str | None) -> None:
        # The socket lives in plugins_registry: only the periodic look (None) concerns it.
        if changed is None and self._endpoint.socket.gone():
            self._wake.set()

    def _on_status(self, registered: bool, error: str) -> None:
        """The kubelet's plugin watcher reports the outcome of registering this socket."""
        self._status = (registered, error)
        if registered:
            self._backoff.reset()  # the next refusal starts again from the shortest delay
            self.stats.record("plugin watcher", time.monotonic() - self._served_at)
            self._endpoint.log.info("registered through the plugin watcher", registrations=self.stats.count)
        else:
            if self._backoff.problem != f"refused: {error}":  # once per change, not per try
                self._endpoint.log.error("the kubelet refused the registration", error=error)
            self._wake.set()

    async def _run(self) -> None:
        log = self._endpoint.log
        while True:
            self._wake.clear()
            refused = self._status is not None and not self._status[0]
            if not self._endpoint.socket.gone() and not self._stream_lost and not refused:
                await self._wake.wait()
                continue
            if self._stream_lost and not refused:
                # a restarted kubelet registers the sockets it finds: give it the chance first
                await asyncio.sleep(REREGISTER_WAIT)
                self._stream_lost = False
                if self._endpoint.streams.count and not self._endpoint.socket.gone():
                    continue
            if refused and self._status is not None:
                delay, changed = self._backoff.fail(f"refused: {self._status[1]}")
                self.stats.failed_tries += 1
                if changed:
                    log.warning("serving again after a refusal, with backoff", retry_in=round(delay, 3))
                await asyncio.sleep(delay)
            log.info("serving the plugin watcher socket again")
            self._stream_lost = False
            await self._endpoint.serve_again()
