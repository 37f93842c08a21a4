"""Registration through ``Register`` on ``kubelet.sock``, kept up across kubelet restarts.

The registrar's task is the re-register loop: it serves the socket again if the kubelet removed
it, waits for ``kubelet.sock``, ends any old ListAndWatch stream (so the kubelet sees it end
before the new registration), registers, and then sleeps until ``kubelet.sock`` is a new file,
the socket disappears, or the kubelet drops the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from devicehost.host.kubelet.client import RegisterError
from devicehost.host.serving.registration import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    Endpoint,
    RegisterClient,
    RegistrarLoop,
    SocketWatch,
)


@dataclass
class KubeletRegistration:
    """Every resource registers with ``Register``; sockets live in the device-plugins dir."""

    directory: Path
    watch: SocketWatch
    client: RegisterClient

    def registrar(self, endpoint: Endpoint) -> KubeletRegistrar:
        return KubeletRegistrar(endpoint, self.watch, self.client)


class KubeletRegistrar(RegistrarLoop):
    """Registers one resource again after every kubelet restart, socket loss or stream loss."""

    def __init__(self, endpoint: Endpoint, watch: SocketWatch, client: RegisterClient) -> None:
        super().__init__(endpoint, watch)
        self._client = client
        self._registered_generation: int | None = None
        self._tried_generation: int | None = None
        """The kubelet.sock generation of the last Register, whether it succeeded or failed."""

    @property
    def registered(self) -> bool:
        return (
            self._registered_generation == self._watch.generation
            and self._watch.inode is not None
            and self._endpoint.streams.count > 0
        )

    def prepare(self, server: grpc.aio.Server) -> None:
        """Nothing to add: the kubelet dials the DevicePlugin service it is told about."""

    def _on_dir_change(self) -> None:
        # A failed Register waits out its backoff unless kubelet.sock or our socket changed:
        # any other file in the dir (the kubelet's checkpoint, other plugins) is no reason to retry.
        if self._endpoint.socket.gone() or self._watch.generation != self._tried_generation:
            self._wake.set()

    async def _run(self) -> None:
        log = self._endpoint.log
        delay = BACKOFF_INITIAL
        reason = "start"
        while True:
            self._wake.clear()
            if self._endpoint.socket.gone():
                log.info("socket was removed, serving again")
                await self._endpoint.serve_again()
                self._registered_generation = None  # serving again ended the kubelet's stream
                reason = "socket removed"
            generation = self._watch.generation
            if self._watch.inode is None:
                log.info("waiting for the kubelet", socket=str(self._watch.kubelet_socket))
                await self._watch.wait_present()
                reason = "kubelet appeared"
                continue
            if generation == self._registered_generation and not self._stream_lost:
                await self._wake.wait()
                reason = "kubelet restarted" if self._watch.generation != generation else "stream lost"
                continue
            if self._stream_lost:
                reason = "stream lost"
            try:
                await self._register(generation, reason)
            except RegisterError as exc:
                self._registered_generation = None
                log.warning("register failed", error=str(exc), retry_in=round(delay, 3))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_INITIAL

    async def _register(self, generation: int, reason: str) -> None:
        """End the old streams, start a new epoch, and register once."""
        endpoint = self._endpoint
        await endpoint.streams.end_all()
        self._stream_lost = False
        endpoint.streams.new_epoch()
        self._tried_generation = generation
        started = time.monotonic()
        await self._client.register(endpoint.name, endpoint.socket.name, endpoint.options)
        self._registered_generation = generation
        self.stats.record(reason, time.monotonic() - started)
        endpoint.log.info(
            "registered",
            reason=reason,
            registrations=self.stats.count,
            took_ms=round((self.stats.last_seconds or 0) * 1000, 2),
        )
