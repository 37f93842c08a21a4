"""Registration through ``Register`` on ``kubelet.sock``, kept up across kubelet restarts.

The registrar's task is the re-register loop: it serves the socket again if the kubelet removed
it, waits for ``kubelet.sock``, ends any old ListAndWatch stream (so the kubelet sees it end
before the new registration), registers, and then sleeps until ``kubelet.sock`` is a new file,
the socket disappears, or the kubelet drops the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from devicehost.host.kubelet.client import RegisterError
from devicehost.host.serving.registration import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    STABLE_AFTER,
    Backoff,
    Endpoint,
    RegisterClient,
    RegistrarLoop,
    SocketWatch,
)

LOST_SOON = "the kubelet ended the stream soon after registering"


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
        self._streamed_generation: int | None = None
        """The kubelet.sock generation of the last successful Register (kept when it is lost)."""
        self._tried_generation: int | None = None
        """The kubelet.sock generation of the last Register, whether it succeeded or failed."""
        self._backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        self._backoff_generation: int | None = None
        self._registered_at = 0.0
        self._lost_soon: _LostSoon | None = None
        """A stream the kubelet ended soon after its registration, not yet told in the log."""
        self._socket_gone = asyncio.Event()  # the dir watch found our socket file gone

    @property
    def registered(self) -> bool:
        return (
            self._registered_generation == self._watch.generation
            and self._watch.inode is not None
            and self._endpoint.streams.count > 0
        )

    def prepare(self, server: grpc.aio.Server) -> None:
        """Nothing to add: the kubelet dials the DevicePlugin service it is told about."""

    def _on_dir_change(self, changed: str | None) -> None:
        # A failed Register waits out its backoff unless kubelet.sock or our socket changed:
        # any other file in the dir (the kubelet's checkpoint, other plugins) is no reason to retry.
        gone = self._own_socket_gone(changed)
        if gone:
            self._socket_gone.set()
        if gone or self._watch.generation != self._tried_generation:
            self._wake.set()

    def _own_socket_gone(self, changed: str | None) -> bool:
        return changed in (None, self._endpoint.socket.name) and self._endpoint.socket.gone()

    async def _run(self) -> None:
        log = self._endpoint.log
        reason = "start"
        waiting_in: int | None = None
        self._backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        while True:
            self._wake.clear()
            if self._endpoint.socket.gone():
                log.info("socket was removed, serving again")
                await self._endpoint.serve_again()
                self._registered_generation = None  # serving again ended the kubelet's stream
                reason = "socket removed"
            generation = self._watch.generation
            if generation != self._backoff_generation:
                self._backoff.reset()  # a new kubelet.sock: start again from the shortest delay
                self._backoff_generation = generation
            if self._watch.inode is None:
                if waiting_in != generation:  # once per absence, not again after serving again
                    log.info("waiting for the kubelet", socket=str(self._watch.kubelet_socket))
                    waiting_in = generation
                # our socket removed meanwhile (a starting kubelet cleans the dir just before it
                # listens) wakes us too: serve it again now, not after the new kubelet.sock
                self._socket_gone.clear()
                if not self._endpoint.socket.gone():
                    await _first(self._watch.wait_present(), self._socket_gone.wait())
                if self._watch.inode is not None:
                    reason = "kubelet appeared"
                continue
            if generation == self._registered_generation and not self._stream_lost:
                await self._wake.wait()
                reason = "kubelet restarted" if self._watch.generation != generation else "stream lost"
                continue
            if self._stream_lost:
                self._stream_lost = False
                if self._streamed_generation != generation:
                    reason = "kubelet restarted"  # the stream ended with the kubelet it went to
                else:  # the kubelet that ended it is still there
                    reason = "stream lost"
                    if await self._back_off_after_loss(generation) or self._watch.generation != generation:
                        continue  # the wait was cut short by a change: look again
            if self._lost_soon is not None:
                reason = "stream lost" if self._lost_soon.generation == generation else "kubelet restarted"
            elif reason == "socket removed" and self._streamed_generation not in (None, generation):
                reason = "kubelet restarted"  # the restarted kubelet cleaned the dir
            try:
                await self._register(generation, reason)
            except RegisterError as exc:
                self._registered_generation = None
                if self._watch.generation != generation:
                    continue  # a failure against a kubelet.sock since replaced tells nothing: try the new one
                # a change of kind (the status code), not of wording, is what gets logged again
                delay, changed = self._backoff.fail(f"register failed: {str(exc).split(':', 1)[0]}")
                self.stats.failed_tries += 1
                if changed:  # once per change of error, not once per try
                    log.warning("register failed", error=str(exc), retry_in=round(delay, 3))
                await self._wait(delay)

    async def _back_off_after_loss(self, generation: int) -> bool:
        """A stream lost soon after its registration is one more failure: wait the backoff first.

        Whether it is told as one is decided later (:meth:`_register`): a kubelet restart also
        ends every stream, and its new kubelet.sock, seen during the wait, makes it an ordinary
        restart. True when the wait ended early (a newer kubelet.sock, or our socket gone).
        """
        log = self._endpoint.log
        held = time.monotonic() - self._registered_at
        self._registered_generation = None  # lost: whatever wakes the wait, register next
        if held >= STABLE_AFTER:
            failures = self._backoff.reset()
            if failures:
                log.info("the registration held again", failed_tries=failures)
            log.warning("ListAndWatch stream ended by the kubelet, registering again")
            self._lost_soon = None
            return False
        delay, changed = self._backoff.fail(LOST_SOON)
        self._lost_soon = _LostSoon(generation, held, delay, changed)
        return await self._wait(delay)

    async def _register(self, generation: int, reason: str) -> None:
        """End the old streams, start a new epoch, and register once."""
        endpoint = self._endpoint
        await endpoint.streams.end_all()
        self._stream_lost = False
        endpoint.streams.new_epoch()
        self._tried_generation = generation
        started = time.monotonic()
        await self._client.register(endpoint.name, endpoint.socket.name, endpoint.options)
        self._registered_generation = self._streamed_generation = generation
        self._registered_at = time.monotonic()
        self.stats.record(reason, self._registered_at - started)
        lost, self._lost_soon = self._lost_soon, None
        if lost is not None and lost.generation == generation:
            # the same kubelet took the registration again: it did end the stream, not restart
            self.stats.failed_tries += 1
            if lost.changed:
                endpoint.log.warning(
                    "the kubelet keeps ending the stream soon after registering; backing off",
                    held_s=round(lost.held, 3),
                    retry_in=round(lost.delay, 3),
                )
        if self._backoff.problem != LOST_SOON or self._backoff.failures <= 1:  # a run of losses: the first
            endpoint.log.info(
                "registered",
                reason=reason,
                registrations=self.stats.count,
                took_ms=round((self.stats.last_seconds or 0) * 1000, 2),
                failed_tries=self._backoff.failures,
            )


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    """Wait until the first of ``waits`` ends; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class _LostSoon:
    """A stream the kubelet of ``generation`` ended ``held`` s after registering; waited ``delay`` s."""

    generation: int
    held: float
    delay: float
    changed: bool
