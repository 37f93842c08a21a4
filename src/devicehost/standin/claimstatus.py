"""The in-memory API server's ResourceClaims as JSON, and their ``status.devices``.

A claim of :class:`~devicehost.standin.apiserver.ApiServerStandIn` is kept as a
:class:`~devicehost.resourceapi.ClaimAllocation`; here it is shown as the real API server shows
it: its allocation results carry the ``bindingConditions`` of the published devices (as the
scheduler copies them), a resourceVersion changes whenever the claim or its status does, a status
write naming an old one is a :class:`~devicehost.resourceapi.Conflict`, a status entry for a
device the claim was not allocated is refused, and watchers see every change.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from devicehost.resourceapi import (
    SLICE_API_VERSION,
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    claim_allocation,
)
from devicehost.standin.scheduling import claim_spec

CLAIM_POLL = 0.05
"""Seconds between looks for changed claims (tests change :attr:`claims` directly)."""
BINDING_FIELDS = ("bindingConditions", "bindingFailureConditions")

Key = tuple[str, str]


class ClaimStatuses(abc.ABC):
    """The claim side of the stand-in API server: the claims, their statuses, and the signal
    every change sets. The server it is a base of says whether it answers (:meth:`_check`) and
    which devices its slices publish (:meth:`_published`)."""

    def __init__(self) -> None:
        self.claims: dict[Key, ClaimAllocation] = {}
        self.statuses: dict[str, list[dict[str, Any]]] = {}
        """``status.devices`` of each claim, by its UID."""
        self.specs: dict[str, Mapping[str, Any]] = {}
        """The ``spec`` each claim was written with, by its UID (a claim a test stores without
        one shows the spec its allocation answers: :func:`spec_of`)."""
        self.changed = asyncio.Event()
        """Set on every change of a claim, its status or a slice."""

    @abc.abstractmethod
    def _check(self) -> None:
        """Raise the API server's error when it does not answer."""

    @abc.abstractmethod
    def _published(self, driver: str) -> dict[tuple[str, str], Mapping[str, Any]]:
        """Each published device of ``driver`` by (pool, device)."""

    async def replace_claim_status(self, body: Mapping[str, Any]) -> None:
        self._check()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        key = (namespace, name)
        what = f"writing the status of ResourceClaim {namespace}/{name}"
        if key not in self.claims:
            raise NotFound(f"{what}: 404 NotFound")
        if body["metadata"].get("resourceVersion") != self._version(key):
            raise Conflict(f"{what}: 409 Conflict: the object has been modified")
        allocated = {(d.driver, d.pool, d.device) for d in self.claims[key].devices}
        devices = [dict(d) for d in body.get("status", {}).get("devices") or ()]
        for device in devices:
            if (device["driver"], device["pool"], device["device"]) not in allocated:
                raise ClusterError(f"{what}: 422 Invalid: {device['device']}: must be an allocated device")
        self.statuses[self.claims[key].uid] = devices
        self.changed.set()

    async def claim_events(self) -> AsyncIterator[tuple[str, ClaimAllocation]]:
        """Every change of a claim; a deleted claim's event carries its last state, as a real
        watch's ``DELETED`` event does."""
        seen: dict[Key, str] = {}
        last: dict[Key, dict[str, Any]] = {}
        while True:
            self._check()
            now = {key: self._version(key) for key in list(self.claims)}
            for key, version in now.items():
                if seen.get(key) != version:
                    last[key] = self.claim_body(*key)
                    yield ("MODIFIED" if key in seen else "ADDED"), claim_allocation(last[key])
            for key in seen.keys() - now.keys():
                yield "DELETED", claim_allocation(last.pop(key))
            seen = now
            await asyncio.sleep(CLAIM_POLL)

    # -- what tests and the simulation read ----------------------------------------------------

    def claim_body(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as the API server shows it (JSON), with its resourceVersion."""
        allocation = self.claims[(namespace, name)]
        results = []
        for device in allocation.devices:
            result: dict[str, Any] = {
                "request": device.request,
                "driver": device.driver,
                "pool": device.pool,
                "device": device.device,
                **self._binding_fields(device.driver, device.pool, device.device),
            }
            if device.admin_access:
                result["adminAccess"] = True
            if device.share_id:
                result |= {"shareID": device.share_id, "consumedCapacity": dict(device.consumed)}
            results.append(result)
        configs = [
            {"opaque": {"driver": c.driver, "parameters": dict(c.parameters)}}
            | ({"requests": list(c.requests)} if c.requests else {})
            for c in allocation.configs
        ]
        devices: dict[str, Any] = {"results": results} | ({"config": configs} if configs else {})
        status: dict[str, Any] = {"allocation": {"devices": devices}} if results else {}
        if self.statuses.get(allocation.uid):
            status["devices"] = [dict(d) for d in self.statuses[allocation.uid]]
        metadata = {
            "namespace": namespace,
            "name": name,
            "uid": allocation.uid,
            "resourceVersion": self._version((namespace, name)),
        }
        return {
            "apiVersion": SLICE_API_VERSION,
            "kind": "ResourceClaim",
            "metadata": metadata,
            "spec": dict(self.specs.get(allocation.uid) or spec_of(allocation)),
            "status": status,
        }

    def device_statuses(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The claim's ``status.devices``."""
        return [dict(d) for d in self.statuses.get(self.claims[(namespace, name)].uid, ())]

    def bindable(self, namespace: str, name: str) -> bool:
        """Whether the scheduler would bind the claim's pod: every binding condition of its
        devices is True in its status (a claim without any is bindable at once)."""
        body = self.claim_body(namespace, name)
        true = {
            (d["driver"], d["pool"], d["device"], c["type"])
            for d in body["status"].get("devices", ())
            for c in d.get("conditions", ())
            if c.get("status") == "True"
        }
        return all(
            (r["driver"], r["pool"], r["device"], condition) in true
            for r in body["status"].get("allocation", {}).get("devices", {}).get("results", ())
            for condition in r.get("bindingConditions", ())
        )

    def _binding_fields(self, driver: str, pool: str, device: str) -> dict[str, list[str]]:
        """The binding conditions of the published device, as the scheduler copies them."""
        entry = self._published(driver).get((pool, device), {})
        return {k: list(entry[k]) for k in BINDING_FIELDS if entry.get(k)}

    def _version(self, key: Key) -> str:
        allocation = self.claims[key]
        seen = repr(allocation) + json.dumps(self.statuses.get(allocation.uid), sort_keys=True)
        return hashlib.sha256(seen.encode()).hexdigest()[:12]


def published(
    stored: Mapping[str, Mapping[str, Any]], driver: str
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Each device of ``driver`` in the ``stored`` slices, by (pool, device), slice by slice."""
    return {
        (body["spec"]["pool"]["name"], device["name"]): device
        for body in stored.values()
        if body["spec"]["driver"] == driver
        for device in body["spec"].get("devices", ())
    }


def spec_of(allocation: ClaimAllocation) -> dict[str, Any]:
    """A ``spec`` its allocation answers (the API server never shows a claim without one): per
    request, as many devices of the class named after their driver as it was allocated, and its
    opaque configs."""
    counts: dict[tuple[str, str], int] = {}
    admin: set[str] = set()
    for device in allocation.devices:
        counts[(device.request, device.driver)] = counts.get((device.request, device.driver), 0) + 1
        if device.admin_access:
            admin.add(device.request)
    requests = [
        body
        for (request, driver), count in counts.items()
        for body in claim_spec(driver, count, request, admin_access=request in admin)["devices"]["requests"]
    ]
    configs = [
        {"opaque": {"driver": c.driver, "parameters": dict(c.parameters)}}
        | ({"requests": list(c.requests)} if c.requests else {})
        for c in allocation.configs
    ]
    return {"devices": {"requests": requests} | ({"config": configs} if configs else {})}
