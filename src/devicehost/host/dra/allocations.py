"""Claims the scheduler allocated this driver's devices to, held through DRA from that moment.

For a resource served ``both``, the device plugin side must not give out a device the scheduler
has given a claim, even before the kubelet prepares the claim (its pod waits to start, or for
binding conditions). :class:`AllocationWatch` watches every ResourceClaim once a resource of the
driver is also served through the device plugin API (it follows the driver's one watch of
every claim, :class:`~.claimwatch.ClaimWatch`), and holds each claim's allocated devices (holder
``allocation <namespace>/<name>``) until the claim is deallocated or deleted; preparing it holds
them again, as the prepared claims (:mod:`.allocated`). When the watch was started again, the
claims held are read again, and those gone, or no longer allocated devices here, are let go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from devicehost.host.dra.allocated import located
from devicehost.host.dra.cluster import ClaimAllocation, ClusterError, NotFound
from devicehost.host.inventory import DRA

if TYPE_CHECKING:
    from devicehost.host.dra.allocated import Attached
    from devicehost.host.dra.cluster import Cluster

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
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._driver = driver
        self._cluster = cluster
        self._resources = resources
        self.log = log
        self.claims: dict[Key, ClaimAllocation] = {}
        """The claims allocated devices of the driver, as last seen."""
        self.held: dict[Key, Held] = {}
        """What each of them holds now (devices of the resources attached)."""
        self._reading: set[asyncio.Task[None]] = set()

    def wanted(self) -> bool:
        """Whether a resource of the driver is also served through the device plugin API."""
        return any(a.server.device_plugin for a in self._resources.values())

    async def stop(self) -> None:
        """Let every claim's devices go."""
        for task in self._reading:
            task.cancel()
        await asyncio.gather(*self._reading, return_exceptions=True)
        for key in list(self.held):
            self._hold(key, {})
        self.claims.clear()

    def refresh(self) -> None:
        """Hold again what each claim seen has of the resources attached now (one was attached)."""
        for key, claim in self.claims.items():
            self._hold(key, self._devices(claim))

    def seen(self, event: tuple[str, ClaimAllocation]) -> None:
        """Hold what a claim is allocated of this driver's devices now (nothing once deleted),
        while a resource is served through both APIs."""
        kind, claim = event
        if self.wanted():
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
            if attached is not None:
                attached.server.table.set_held(holder, DRA, wanted.get(resource, ()))
        if wanted:
            self.held[key] = wanted

    def restarted(self) -> None:
        """The watch may have missed a deletion: the claims held are read again."""
        if self.claims:
            task = asyncio.create_task(self._read_again(list(self.claims)), name="allocations read again")
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)

    async def _read_again(self, keys: list[Key]) -> None:
        for key in keys:
            try:
                claim: ClaimAllocation | None = await self._cluster.claim(*key)
            except NotFound:
                claim = None
            except ClusterError:
                continue  # read again at the next restart
            self._follow(key, claim)
