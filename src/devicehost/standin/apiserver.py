"""An in-memory API server and scheduler for DRA: what the host publishes, and claims on it.

:class:`ApiServerStandIn` keeps ResourceSlices as the host writes them and allocates claims from
them as the scheduler does (:mod:`devicehost.standin.scheduling`, with DeviceClasses and
DeviceTaintRules; the rules are :mod:`devicehost.standin.allocator`'s), so a claim's whole
life runs without a cluster: ``devicehost run --simulate-kubelet`` serves DRA resources against
it, and the test kit and the conformance suite drive claims on it. It answers the calls of the
host's ``Cluster`` seam (:mod:`devicehost.host.dra.cluster`) with the values of
:mod:`devicehost.resourceapi`, and imports nothing of the host. Claims as JSON, their
``status.devices`` and a watch of them are :mod:`devicehost.standin.claimstatus`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from devicehost.resourceapi import (
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    ServedApi,
    claim_allocation,
)
from devicehost.standin.capacity import consumption
from devicehost.standin.claimstatus import ClaimStatuses, published
from devicehost.standin.scheduling import Scheduling, Unschedulable, claim_spec
from devicehost.standin.versions import parse

__all__ = ["NODE_UID", "ApiServerStandIn", "Unschedulable", "claim_spec", "share_of"]

NODE_UID = "0f0f0f0f-node-uid"

SliceEvent = tuple[str, Mapping[str, Any]]
"""A watch event of a ResourceSlice: ``ADDED``, ``MODIFIED`` or ``DELETED``, and the slice."""


class SliceWatches:
    """The open watches of ResourceSlices: each gets every change as the real API server's
    watch does, the slices there when it opened first (a watch from no resourceVersion)."""

    def __init__(self) -> None:
        self._queues: list[asyncio.Queue[SliceEvent]] = []

    async def follow(
        self, stored: Iterable[Mapping[str, Any]], node: str, driver: str
    ) -> AsyncIterator[SliceEvent]:
        """The events of ``node``'s slices of ``driver``, those ``stored`` now first, for ever."""
        queue: asyncio.Queue[SliceEvent] = asyncio.Queue()
        for body in stored:
            queue.put_nowait(("ADDED", body))
        self._queues.append(queue)
        try:
            while True:
                kind, body = await queue.get()
                if body["spec"]["nodeName"] == node and body["spec"]["driver"] == driver:
                    yield kind, body
        finally:
            self._queues.remove(queue)

    def tell(self, kind: str, body: Mapping[str, Any]) -> None:
        """Every open watch gets the change."""
        for queue in self._queues:
            queue.put_nowait((kind, body))


class ApiServerStandIn(ClaimStatuses, Scheduling):
    """ResourceSlices and ResourceClaims in memory, with the calls of the host's ``Cluster`` seam."""

    def __init__(self, kubernetes_version: str = "1.35") -> None:  # 1.34 to 1.37: see standin/versions.py
        super().__init__()
        self.version = parse(kubernetes_version)
        self.stored: dict[str, dict[str, Any]] = {}
        """ResourceSlices by name, as stored (with a resourceVersion)."""
        self.device_taints_kept = self.version.enabled("DRADeviceTaints")
        """Whether it keeps device taints on slices (``DRADeviceTaints``); else it drops them."""
        self.down: str | None = None
        """When set, every call fails with this as the API server's error."""
        self._versions = itertools.count(1)
        self._slice_watches = SliceWatches()

    # -- the seam ------------------------------------------------------------------------------

    async def node_uid(self, node: str) -> str:
        self._check()
        return NODE_UID

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        self._check()
        if (namespace, name) not in self.claims:
            raise NotFound(f"ResourceClaim {namespace}/{name}: 404 NotFound")
        return claim_allocation(self.claim_body(namespace, name))

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

    async def served_api(self, node: str, driver: str) -> ServedApi:
        self._check()
        return self.version.served_api(self.device_taints_kept)

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        name = body["metadata"]["name"]
        if name in self.stored:
            raise ClusterError(f"creating ResourceSlice {name}: 409 AlreadyExists")
        return self._store(body)

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        name = body["metadata"]["name"]
        current = self.stored.get(name)
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"].get(
            "resourceVersion"
        ):
            raise Conflict(f"replacing ResourceSlice {name}: 409 Conflict")
        return self._store(body)

    async def delete_slice(self, name: str) -> None:
        self._check()
        self.delete(name)

    async def slice_events(self, node: str, driver: str) -> AsyncIterator[SliceEvent]:
        self._check()
        async for event in self._slice_watches.follow(self.stored.values(), node, driver):
            yield event

    async def close(self) -> None:
        return None

    # -- what tests do -------------------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Delete a slice, as the kubelet does at its start; watchers are told."""
        body = self.stored.pop(name, None)
        if body is not None:
            self._slice_watches.tell("DELETED", body)
            self._bump()

    def devices(self, driver: str) -> list[tuple[str, str]]:
        """(pool, device) of every published device of ``driver``, slice by slice."""
        return list(published(self.stored, driver))

    async def wait(self, predicate: Any, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until ``predicate(self)`` is true, checking after every change."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self.changed.clear()
                await self.changed.wait()

    def _store(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.device_taints_kept and body["spec"].get("devices"):
            devices = [{k: v for k, v in d.items() if k != "taints"} for d in body["spec"]["devices"]]
            body = {**body, "spec": {**body["spec"], "devices": devices}}
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(next(self._versions))}}
        kind = "MODIFIED" if body["metadata"]["name"] in self.stored else "ADDED"
        self.stored[body["metadata"]["name"]] = stored
        self._slice_watches.tell(kind, stored)
        self._bump()
        return stored

    def _bump(self) -> None:
        """After every change: wake the waiters (a test's subclass looks at each state here)."""
        self.changed.set()

    def _check(self) -> None:
        if self.down is not None:
            raise ClusterError(self.down)

    def _published(self, driver: str) -> dict[tuple[str, str], Mapping[str, Any]]:
        return published(self.stored, driver)


def share_of(
    device: Mapping[str, Any], consumed: Mapping[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """A new share ID and what the share takes of the published ``device`` that allows multiple
    allocations for ``consumed`` (capacity requests), by its request policies as the scheduler
    computes it (:func:`devicehost.standin.capacity.consumption`); ("", {}) for one taken whole.

    :raises ValueError: the device cannot give a share of ``consumed``.
    """
    if not device.get("allowMultipleAllocations"):
        return "", {}
    taken = consumption(device.get("capacity") or {}, consumed or {})
    if taken is None:
        raise ValueError(f"device {device.get('name')!r} cannot give a share of {dict(consumed or {})}")
    return str(uuid.uuid4()), {name: text for name, (_, text) in taken.items()}
