"""Every ResourceClaim, watched once per driver for what follows claims.

A watch of every claim in the cluster costs the API server, on every node: a driver opens one,
and only once one of its followers wants it (:class:`~.binding.BindingWatch`: a device has binding
conditions; :class:`~.allocations.AllocationWatch`: a resource is served ``both``); it logs
``watching ResourceClaims`` once, with what for. Each event goes to every follower. A watch that
breaks is started again with backoff (:func:`.rewatch.rewatch`), and every follower is told: it
may have missed events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import structlog

from devicehost.host.dra.rewatch import rewatch
from devicehost.host.serving.registration import Backoff

if TYPE_CHECKING:
    from devicehost.host.dra.cluster import ClaimAllocation, Cluster

BACKOFF = (1.0, 30.0)
"""Seconds before the watch is started again after its first failure in a row, and the most."""


class Follower(Protocol):
    """What follows a driver's claims."""

    def wanted(self) -> bool:
        """Whether it needs the claims now."""

    def seen(self, event: tuple[str, ClaimAllocation]) -> None:
        """One event of the watch: ``ADDED``, ``MODIFIED`` or ``DELETED``, and the claim."""

    def restarted(self) -> None:
        """The watch was started again: events may have been missed."""


class ClaimWatch:
    """One driver's watch of every ResourceClaim, for its ``followers`` (by what they follow)."""

    def __init__(
        self,
        cluster: Cluster,
        followers: Mapping[str, Follower],
        changed: Callable[[int], Awaitable[int]],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._cluster = cluster
        self._followers = followers
        self._changed = changed
        self.log = log
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start :meth:`run` (once: later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="claim watch")

    async def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        """Once a follower wants the claims (after each change of the driver's devices, asked
        again), watch them for ever, the watch started again with backoff when it breaks."""
        seen = -1
        while not (wanting := [what for what, f in self._followers.items() if f.wanted()]):
            seen = await self._changed(seen)
        self.log.info("watching ResourceClaims", purposes=wanting)
        await rewatch(
            self._cluster.claim_events,
            self._seen,
            "ResourceClaims",
            Backoff(*BACKOFF),
            self.log,
            restarted=self._restarted,
        )

    def _seen(self, event: tuple[str, ClaimAllocation]) -> None:
        for follower in self._followers.values():
            follower.seen(event)

    def _restarted(self) -> None:
        for follower in self._followers.values():
            follower.restarted()
