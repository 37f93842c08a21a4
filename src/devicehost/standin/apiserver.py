"""An in-memory API server and scheduler for DRA: what the host publishes, and claims on it.

:class:`ApiServerStandIn` keeps ResourceSlices as the host writes them and allocates claims from
them the way the scheduler would for a simple request (``count`` devices of one driver, none
given to another claim; a subrequest, an admin-access claim and opaque configuration when asked
for), so a claim's whole life runs without a cluster: ``devicehost run --simulate-kubelet``
serves DRA resources against it, and the test kit and the conformance suite drive claims on it.
It answers the calls of the host's ``Cluster`` seam (:mod:`devicehost.host.dra.cluster`) with the
values of :mod:`devicehost.resourceapi`, and imports nothing of the host. Claims as JSON, their
``status.devices`` and a watch of them are :mod:`devicehost.standin.claimstatus`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from devicehost.resourceapi import (
    AllocatedDevice,
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    OpaqueConfig,
)
from devicehost.standin.claimstatus import ClaimStatuses, published

NODE_UID = "0f0f0f0f-node-uid"


class ApiServerStandIn(ClaimStatuses):
    """ResourceSlices and ResourceClaims in memory, with the calls of the host's ``Cluster`` seam."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[str, dict[str, Any]] = {}
        """ResourceSlices by name, as stored (with a resourceVersion)."""
        self.device_taints_kept = False
        """Whether it keeps device taints on slices (an API server with ``DRADeviceTaints``);
        without, it drops them as the real one does."""
        self.down: str | None = None
        """When set, every call fails with this as the API server's error."""
        self._versions = itertools.count(1)
        self._deletions: list[asyncio.Queue[str]] = []

    # -- the seam ------------------------------------------------------------------------------

    async def node_uid(self, node: str) -> str:
        self._check()
        return NODE_UID

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        self._check()
        found = self.claims.get((namespace, name))
        if found is None:
            raise NotFound(f"ResourceClaim {namespace}/{name}: 404 NotFound")
        return found

    async def slices(self, node: str, driver: str) -> dict[str, Mapping[str, Any]]:
        self._check()
        return {
            name: body
            for name, body in self.stored.items()
            if body["spec"]["nodeName"] == node and body["spec"]["driver"] == driver
        }

    async def device_taints(self, node: str, driver: str) -> bool:
        self._check()
        return self.device_taints_kept

    async def create_slice(self, body: Mapping[str, Any]) -> None:
        self._check()
        name = body["metadata"]["name"]
        if name in self.stored:
            raise ClusterError(f"creating ResourceSlice {name}: 409 AlreadyExists")
        self._store(body)

    async def replace_slice(self, body: Mapping[str, Any]) -> None:
        self._check()
        name = body["metadata"]["name"]
        current = self.stored.get(name)
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"].get(
            "resourceVersion"
        ):
            raise Conflict(f"replacing ResourceSlice {name}: 409 Conflict")
        self._store(body)

    async def delete_slice(self, name: str) -> None:
        self._check()
        self.delete(name)

    async def slice_deletions(self, node: str, driver: str) -> AsyncIterator[str]:
        self._check()
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._deletions.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._deletions.remove(queue)

    async def close(self) -> None:
        return None

    # -- what tests do -------------------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Delete a slice, as the kubelet does at its start; watchers are told."""
        if self.stored.pop(name, None) is not None:
            for queue in self._deletions:
                queue.put_nowait(name)
            self._bump()

    def devices(self, driver: str) -> list[tuple[str, str]]:
        """(pool, device) of every published device of ``driver``, slice by slice."""
        return list(published(self.stored, driver))

    def allocate(
        self,
        driver: str,
        count: int = 1,
        *,
        namespace: str = "default",
        name: str = "",
        request: str = "req",
        config: Mapping[str, Any] | None = None,
        admin_access: bool = False,
        devices: Sequence[str] = (),
        consumed: Mapping[str, str] | None = None,
    ) -> tuple[str, str, str]:
        """Allocate ``count`` free devices of ``driver`` to a new claim; its (namespace, uid, name).

        ``request`` may be ``request/subrequest`` (a prioritized list's choice); ``config`` is the
        claim's opaque parameters for ``driver`` and the request; an ``admin_access`` claim may
        take devices other claims hold; ``devices`` names the ones to take. Of a device that
        allows multiple allocations the claim gets a new share (:func:`share_of`, ``consumed``).
        """
        entries = published(self.stored, driver)
        free = free_devices(entries, self.claims.values(), admin_access, devices)
        if len(free) < count:
            raise AssertionError(f"only {len(free)} free devices of {driver}, {count} asked for")
        uid = str(uuid.uuid4())
        name = name or f"claim-{uid[:8]}"
        chosen = tuple(
            AllocatedDevice(
                request, driver, pool, device, admin_access, *share_of(entries[pool, device], consumed)
            )
            for pool, device in free[:count]
        )
        configs = (OpaqueConfig(driver, config, (request.partition("/")[0],)),) if config is not None else ()
        self.claims[(namespace, name)] = ClaimAllocation(uid, chosen, configs)
        return namespace, uid, name

    async def wait(self, predicate: Any, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until ``predicate(self)`` is true, checking after every change."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self.changed.clear()
                await self.changed.wait()

    def _store(self, body: Mapping[str, Any]) -> None:
        if not self.device_taints_kept and body["spec"].get("devices"):
            devices = [{k: v for k, v in d.items() if k != "taints"} for d in body["spec"]["devices"]]
            body = {**body, "spec": {**body["spec"], "devices": devices}}
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(next(self._versions))}}
        self.stored[body["metadata"]["name"]] = stored
        self._bump()

    def _bump(self) -> None:
        """After every change: wake the waiters (a test's subclass looks at each state here)."""
        self.changed.set()

    def _check(self) -> None:
        if self.down is not None:
            raise ClusterError(self.down)

    def _published(self, driver: str) -> dict[tuple[str, str], Mapping[str, Any]]:
        return published(self.stored, driver)


def free_devices(
    entries: Mapping[tuple[str, str], Mapping[str, Any]],
    claims: Iterable[ClaimAllocation],
    admin_access: bool,
    devices: Sequence[str],
) -> list[tuple[str, str]]:
    """(pool, device) of the published ``entries`` a new claim may take: those no claim holds
    whole (any, for ``admin_access``; a shared one always), of ``devices`` when named."""
    taken = {(d.pool, d.device) for c in claims for d in c.devices if not d.admin_access}
    return [
        d
        for d, entry in entries.items()
        if (admin_access or d not in taken or entry.get("allowMultipleAllocations"))
        and (not devices or d[1] in devices)
    ]


def share_of(
    device: Mapping[str, Any], consumed: Mapping[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """A new share ID and what the share takes (``consumed``, the rest at each capacity's request
    policy default, else all of it) of the published ``device`` that allows multiple allocations,
    as the scheduler allocates it; ("", {}) for one taken whole."""
    if not device.get("allowMultipleAllocations"):
        return "", {}
    taken = {
        name: str((capacity.get("requestPolicy") or {}).get("default", capacity["value"]))
        for name, capacity in (device.get("capacity") or {}).items()
    }
    return str(uuid.uuid4()), {**taken, **(consumed or {})}
