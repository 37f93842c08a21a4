"""Claims the scheduler allocated this driver's devices to, held through DRA from that moment.

For a resource served ``both``, the device plugin side must not give out a device the scheduler
has given a claim, even before the kubelet prepares the claim (its pod waits to start, or for
binding conditions). :class:`AllocationWatch` watches every ResourceClaim once a resource of the
driver is also served through the device plugin API, and holds each claim's allocated devices
(holder ``allocation <namespace>/<name>``) until the claim is deallocated or deleted; preparing
it holds them again, as the prepared claims (:mod:`.allocated`). A watch that breaks is started
again with backoff (:func:`.rewatch.rewatch`); the claims held when it broke are then read again,
and those gone, or no longer allocated devices here, are let go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import structlog

from devicehost.host.dra.allocated import located
from devicehost.host.dra.cluster import ClaimAllocation, ClusterError, NotFound
from devicehost.host.dra.rewatch import rewatch
from devicehost.host.inventory import DRA
from devicehost.host.serving.registration import Backoff

if TYPE_CHECKING:
    from devicehost.host.dra.allocated import Attached
    from devicehost.host.dra.cluster import Cluster

BACKOFF = (1.0, 30.0)
"""Seconds before the watch is started again after its first failure in a row, and the most."""

Key = tuple[str, str]
Held = dict[str, tuple[str, ...]]
"""Device IDs by resource."""


class AllocationWatch:
    """One driver's allocated claims, their devices held in their resources' inventories."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        resources: Mapping[str, Attached],
        changed: Callable[[int], Awaitable[int]],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._driver = driver
        self._cluster = cluster
        self._resources = resources
        self._changed = changed
        self.log = log
        self.claims: dict[Key, ClaimAllocation] = {}
        """The claims allocated devices of the driver, as last seen."""
        self.held: dict[Key, Held] = {}
        """What each of them holds now (devices of the resources attached)."""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start :meth:`run` (once: later calls do nothing)."""
        if not self._tasks:
            self._tasks.append(asyncio.create_task(self.run(), name=f"allocations {self._driver}"))

    def wanted(self) -> bool:
        """Whether a resource of the driver is also served through the device plugin API."""
        return any(a.server.device_plugin for a in self._resources.values())

    async def run(self) -> None:
        """Once a resource is served through both APIs, watch the claims for ever, the watch
        started again with backoff when it breaks (no watch while none is: nothing to hold)."""
        seen = -1
        while not self.wanted():
            seen = await self._changed(seen)
        self.log.info("watching ResourceClaims: a resource is served through both APIs")
        await rewatch(
            self._cluster.claim_events,
            self._seen,
            "ResourceClaims for allocations",
            Backoff(*BACKOFF),
            self.log,
            restarted=self._restarted,
        )

    async def stop(self) -> None:
        """Stop watching, and let every claim's devices go."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self.held):
            self._hold(key, {})
        self.claims.clear()

    def refresh(self) -> None:
        """Hold again what each claim seen has of the resources attached now (one was attached)."""
        for key, claim in self.claims.items():
            self._hold(key, self._devices(claim))

    def _seen(self, event: tuple[str, ClaimAllocation]) -> None:
        kind, claim = event
        self._follow((claim.namespace, claim.name), None if kind == "DELETED" else claim)

    def _follow(self, key: Key, claim: ClaimAllocation | None) -> None:
        """``claim`` as it is now (None: gone), its devices held or let go."""
        if claim is None or not claim.devices_of(self._driver):
            self.claims.pop(key, None)
            self._hold(key, {})
            return
        self.claims[key] = claim
        self._hold(key, self._devices(claim))

    def _devices(self, claim: ClaimAllocation) -> Held:
        found: dict[str, list[str]] = {}
        for _, attached, device in located(claim.devices_of(self._driver), self._resources):
            if attached is not None and device is not None:
                found.setdefault(attached.server.name, []).append(device.id)
        return {resource: tuple(ids) for resource, ids in found.items()}

    def _hold(self, key: Key, wanted: Held) -> None:
        """The claim ``key`` holds exactly ``wanted`` through DRA."""
        holder = f"allocation {key[0]}/{key[1]}"
        before = self.held.pop(key, {})
        for resource in before.keys() | wanted.keys():
            attached = self._resources.get(resource)
            if attached is None:
                continue
            gone = set(before.get(resource, ())) - set(wanted.get(resource, ()))
            attached.server.table.hold(holder, DRA, gone, False)
            attached.server.table.hold(holder, DRA, wanted.get(resource, ()))
        if wanted:
            self.held[key] = wanted

    def _restarted(self) -> None:
        """The watch may have missed a deletion: the claims held are read again."""
        self._tasks = [t for t in self._tasks if not t.done()]
        if self.claims:
            self._tasks.append(
                asyncio.create_task(self._read_again(list(self.claims)), name="allocations again")
            )

    async def _read_again(self, keys: list[Key]) -> None:
        for key in keys:
            try:
                claim: ClaimAllocation | None = await self._cluster.claim(*key)
            except NotFound:
                claim = None
            except ClusterError:
                continue  # read again at the next restart
            self._follow(key, claim)
