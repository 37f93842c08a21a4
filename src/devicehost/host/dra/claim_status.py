"""A claim's ``status.devices`` written from the backend's ``devicehost_device_status`` answers.

:func:`write_status` takes the claim as read (:class:`~devicehost.resourceapi.ClaimAllocation`),
picks this driver's devices in it (all of them once the claim is prepared; before that, those
whose binding conditions are still awaited), asks the backend once per resource and request
(with the claim request of :func:`.allocated.claim_request`, the one prepare hands the allocate
hook), and writes the answers into the claim's status: an entry per device (driver, pool,
device, and its share when it has one), its conditions merged by type (a condition keeps its
``lastTransitionTime`` while its status stays), its ``data`` and ``networkData``. Other drivers'
entries and what the answer leaves out stay as they are. Nothing is written when nothing
changed; a write that lost a race with another writer (409) is done again on the claim read anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from devicehost.hookspecs.types import DeviceStatus, NetworkData
from devicehost.host.backends.backend import HookError
from devicehost.host.dra.allocated import ClaimRefused, Found, by_request, claim_request, located
from devicehost.host.dra.checkpoint import PreparedClaim
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, ClusterError, Conflict, NotFound
from devicehost.resourceapi import status_key

if TYPE_CHECKING:
    from devicehost.host.dra.allocated import Attached
    from devicehost.host.dra.cluster import Cluster

HOOK = "devicehost_device_status"
WRITE_TRIES = 5
"""Status writes tried on a claim that keeps changing under them (409 Conflict) before giving up."""
EMPTY = DeviceStatus()
"""A status that says nothing: no entry is written for it."""
AFTER_PREPARE_TIMEOUT = 10.0
"""Seconds the status of a claim just prepared may take (the kubelet waits for the answer)."""


def our_devices(claim: ClaimAllocation, driver: str, resources: Mapping[str, Attached]) -> list[Found]:
    """The claim's allocated devices of ``driver`` in a pool this host publishes, whose backend
    has the device status hook."""
    return [
        Found(allocated, attached, device)
        for allocated, attached, device in located(claim.devices_of(driver), resources)
        if attached is not None and device is not None and attached.server.backend.implements(HOOK)
    ]


def awaiting(claim: ClaimAllocation, ours: Sequence[Found]) -> list[Found]:
    """Those of ``ours`` whose binding conditions are not all True yet, and that no binding
    failure condition marks failed (the scheduler gives those up)."""
    shown = {
        status_key(d): {c.get("type"): c.get("status") for c in d.get("conditions", ())}
        for d in claim.statuses
    }
    waiting = []
    for device in ours:
        conditions = shown.get(device.allocated.key, {})
        failed = any(conditions.get(c) == "True" for c in device.allocated.binding_failure_conditions)
        ready = all(conditions.get(c) == "True" for c in device.allocated.binding_conditions)
        if not failed and not ready:
            waiting.append(device)
    return waiting


async def reread(cluster: Cluster, claim: ClaimAllocation) -> ClaimAllocation | None:
    """``claim`` read anew; None when it is gone (or another claim of its name took its place)."""
    try:
        found = await cluster.claim(claim.namespace, claim.name)
    except NotFound:
        return None
    return replace(found, namespace=claim.namespace, name=claim.name) if found.uid == claim.uid else None


async def write_status(
    cluster: Cluster, driver: str, resources: Mapping[str, Attached], claim: ClaimAllocation, prepared: bool
) -> bool:
    """Ask the backends and write ``claim``'s status for this driver's devices: all of them when
    ``prepared``, else those awaiting binding conditions. Whether any of its devices still awaits
    them afterwards (False too when the claim is gone). ``claim`` is read anew only when a write
    loses a race.

    :raises ClusterError: the claim could not be read or written.
    :raises HookError: a backend's hook failed or answered what the contract does not allow.
    :raises ClaimRefused: the backend refuses the claim's configuration (its prepare fails too).
    """
    for _ in range(WRITE_TRIES):
        ours = our_devices(claim, driver, resources)
        chosen = ours if prepared else awaiting(claim, ours)
        if not chosen:
            return False
        answers = await _ask(claim, chosen, driver, prepared)
        before = [dict(d) for d in claim.statuses]
        said = [d for d in chosen if d in answers and answers[d] != EMPTY]
        devices = merged(before, [entry(d.allocated, answers[d], claim.status_of(d.allocated)) for d in said])
        if devices == before:
            return bool(awaiting(claim, ours))
        body = claim.body
        try:
            await cluster.replace_claim_status(
                {**body, "status": {**body.get("status", {}), "devices": devices}}
            )
        except NotFound:
            return False  # deleted since it was read: nothing awaits it any more
        except Conflict:
            fresh = await reread(cluster, claim)
            if fresh is None:
                return False
            claim = fresh
            continue
        return bool(awaiting(replace(claim, statuses=tuple(devices)), ours))
    raise ClusterError(
        f"ResourceClaim {claim.namespace}/{claim.name}: its status changed under {WRITE_TRIES} writes in a row"
    )


async def _ask(
    claim: ClaimAllocation, chosen: Sequence[Found], driver: str, prepared: bool
) -> dict[Found, DeviceStatus]:
    """The backend's answer for each of ``chosen``, asked once per resource and request."""
    answers: dict[Found, DeviceStatus] = {}
    for (resource, request), devices in by_request(chosen).items():
        asked = claim_request(claim, driver, request, devices)
        backend = devices[0].attached.server.backend
        said = await backend.device_status(resource, tuple(d.device.id for d in devices), asked, prepared)
        answers.update((d, said[d.device.id]) for d in devices if d.device.id in said)
    return answers


def entry(
    device: AllocatedDevice, status: DeviceStatus, previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ``status.devices`` entry of one allocated device: ``previous`` (what the claim shows)
    with ``status`` applied."""
    previous = previous or {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    named = zip(("driver", "pool", "device", "shareID"), device.key, strict=True)
    written: dict[str, Any] = {k: v for k, v in named if v}
    conditions = {c["type"]: dict(c) for c in previous.get("conditions", ())}
    for kind, condition in status.conditions.items():
        value = "True" if condition.status else "False"
        was = conditions.get(kind, {})
        conditions[kind] = {
            "type": kind,
            "status": value,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": was["lastTransitionTime"] if was.get("status") == value else now,
        }
    if conditions:
        written["conditions"] = list(conditions.values())
    data = dict(status.data) if status.data is not None else previous.get("data")
    if data is not None:
        written["data"] = data
    network = network_data(status.network) if status.network is not None else previous.get("networkData")
    if network:
        written["networkData"] = network
    return written


def network_data(network: NetworkData) -> dict[str, Any]:
    """``networkData`` as the API spells it, empty fields left out."""
    found: dict[str, Any] = {
        "interfaceName": network.interface_name,
        "ips": list(network.ips),
        "hardwareAddress": network.hardware_address,
    }
    return {k: v for k, v in found.items() if v}


def merged(existing: Sequence[Mapping[str, Any]], entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``existing`` with each of ``entries`` in place of the one of the same device (appended
    when there is none), in order."""
    new = {status_key(e): e for e in entries}
    result = [new.pop(status_key(d), dict(d)) for d in existing]
    return result + list(new.values())


async def after_prepare(
    cluster: Cluster,
    driver: str,
    resources: Mapping[str, Attached],
    answers: Mapping[str, PreparedClaim | str],
    reads: Mapping[str, ClaimAllocation | BaseException],
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """The status of each claim just prepared (its answer not an error), written within
    :data:`AFTER_PREPARE_TIMEOUT` when a backend of this driver has the hook, from the claim as
    prepare read it (``reads``; read here, once, for a claim prepared before the call); a failure
    is logged, never the claim's (its devices are prepared: the status only lacks their data)."""
    if not any(a.server.backend.implements(HOOK) for a in resources.values()):
        return
    for uid, prepared in answers.items():
        if isinstance(prepared, str):
            continue
        read = reads.get(uid)
        claim = read if isinstance(read, ClaimAllocation) else None
        try:
            async with asyncio.timeout(AFTER_PREPARE_TIMEOUT):
                if claim is None:
                    claim = await reread(
                        cluster, ClaimAllocation(uid, (), (), prepared.namespace, prepared.name)
                    )
                if claim is not None:
                    await write_status(cluster, driver, resources, claim, prepared=True)
        except (ClusterError, HookError, ClaimRefused, TimeoutError) as exc:
            where = f"{prepared.namespace}/{prepared.name}"
            log.warning("device status not written", claim=where, uid=uid, error=str(exc) or "timed out")
