"""A claim's ``status.devices`` written from the backend's ``devicehost_device_status`` answers.

:func:`write_status` reads the claim, picks this driver's devices in it (all of them once the
claim is prepared; before that, those whose binding conditions are still awaited), asks the
backend once per resource and request, and writes the answers into the claim's status: an entry
per device (driver, pool, device, and its share when it has one), its conditions merged by type
(a condition keeps its ``lastTransitionTime`` while its status stays), its ``data`` and
``networkData``. Other drivers' entries and what the answer leaves out stay as they are. Nothing
is written when nothing changed; a write that lost a race with another writer (409) is done
again on the claim read anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from devicehost.hookspecs.types import ClaimRequest, DeviceStatus, NetworkData, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.cluster import ClusterError, Conflict, NotFound
from devicehost.resourceapi import allocated_device, claim_allocation

if TYPE_CHECKING:
    from devicehost.host.dra.claims import Attached
    from devicehost.host.dra.cluster import Cluster

HOOK = "devicehost_device_status"
WRITE_TRIES = 5
"""Status writes tried on a claim that keeps changing under them (409 Conflict) before giving up."""
EMPTY = DeviceStatus()
"""A status that says nothing: no entry is written for it."""
AFTER_PREPARE_TIMEOUT = 10.0
"""Seconds the status of a claim just prepared may take (the kubelet waits for the answer)."""


@dataclass(frozen=True, eq=False)
class Ours:
    """One device of a claim's allocation that this driver publishes (hashed by identity)."""

    result: Mapping[str, Any]
    """The allocation result, as the claim's status holds it."""
    device_id: str
    attached: Attached


def our_devices(claim: Mapping[str, Any], driver: str, resources: Mapping[str, Attached]) -> list[Ours]:
    """The claim's allocated devices of ``driver`` in a pool this host publishes."""
    by_pool = {a.pool: a for a in resources.values()}
    named: dict[str, dict[str, str]] = {}  # pool -> DRA device name -> device ID, built once a pool
    found = []
    for result in _results(claim):
        pool = result.get("pool", "")
        attached = by_pool.get(pool)
        if result.get("driver") != driver or attached is None:
            continue
        if pool not in named:
            named[pool] = {names.device_name(d.id): d.id for d in attached.server.table.devices}
        device_id = named[pool].get(result.get("device", ""))
        if device_id is not None:
            found.append(Ours(result, device_id, attached))
    return found


def awaiting(claim: Mapping[str, Any], ours: Sequence[Ours]) -> list[Ours]:
    """Those of ``ours`` whose binding conditions are not all True yet, and that no binding
    failure condition marks failed (the scheduler gives those up)."""
    shown = {
        _key(d): {c.get("type"): c.get("status") for c in d.get("conditions", ())} for d in _statuses(claim)
    }
    waiting = []
    for device in ours:
        conditions = shown.get(_key(device.result), {})
        failed = any(conditions.get(c) == "True" for c in device.result.get("bindingFailureConditions", ()))
        ready = all(conditions.get(c) == "True" for c in device.result.get("bindingConditions", ()))
        if not failed and not ready:
            waiting.append(device)
    return waiting


async def write_status(
    cluster: Cluster,
    driver: str,
    resources: Mapping[str, Attached],
    ref: tuple[str, str, str],
    prepared: bool,
) -> bool:
    """Ask the backends and write the claim ``ref`` = (namespace, uid, name)'s status for this
    driver's devices: all of them when ``prepared``, else those awaiting binding conditions.
    Whether any of its devices still awaits them afterwards (False too when the claim is gone).

    :raises ClusterError: the claim could not be read or written.
    :raises HookError: a backend's hook failed or answered what the contract does not allow.
    """
    namespace, uid, name = ref
    for _ in range(WRITE_TRIES):
        try:
            claim = await cluster.claim_object(namespace, name)
        except NotFound:
            return False
        if claim.get("metadata", {}).get("uid") != uid:
            return False
        ours = [
            d for d in our_devices(claim, driver, resources) if d.attached.server.backend.implements(HOOK)
        ]
        chosen = ours if prepared else awaiting(claim, ours)
        if not chosen:
            return False
        answers = await _ask(claim, chosen, driver, prepared)
        before = _statuses(claim)
        said = [d for d in chosen if d in answers and answers[d] != EMPTY]
        devices = merged(before, [entry(d.result, answers[d], _find(before, d.result)) for d in said])
        if devices == before:
            return bool(awaiting(claim, ours))
        written = {**claim, "status": {**claim.get("status", {}), "devices": devices}}
        try:
            await cluster.replace_claim_status(written)
        except Conflict:
            continue
        return bool(awaiting(written, ours))
    raise ClusterError(
        f"ResourceClaim {namespace}/{name}: its status changed under {WRITE_TRIES} writes in a row"
    )


async def _ask(
    claim: Mapping[str, Any], chosen: Sequence[Ours], driver: str, prepared: bool
) -> dict[Ours, DeviceStatus]:
    """The backend's answer for each of ``chosen``, asked once per resource and request."""
    allocation = claim_allocation(claim)
    meta = claim["metadata"]
    groups: dict[tuple[str, str], list[Ours]] = {}
    for device in chosen:
        groups.setdefault((device.attached.server.name, device.result["request"]), []).append(device)
    answers: dict[Ours, DeviceStatus] = {}
    for (resource, request), devices in groups.items():
        backend = devices[0].attached.server.backend
        config = allocation.config(driver, request)
        try:
            checked = None if config is None else backend.claim_config(config.parameters, "parameters")
        except HookError:
            checked = None  # the kubelet's prepare refuses the claim, naming the key path
        asked = ClaimRequest(
            request,
            f"{meta['namespace']}/{meta['name']}",
            meta["uid"],
            checked,
            any(bool(d.result.get("adminAccess")) for d in devices),
            {d.device_id: share for d in devices if (share := share_of(d.result)) is not None},
        )
        said = await backend.device_status(resource, tuple(d.device_id for d in devices), asked, prepared)
        answers.update((d, said[d.device_id]) for d in devices if d.device_id in said)
    return answers


def share_of(result: Mapping[str, Any]) -> Share | None:
    """The share an allocation result names (a device that allows multiple allocations), or None."""
    device = allocated_device(result)
    return Share(device.share_id, device.consumed) if device.share_id else None


def entry(
    result: Mapping[str, Any], status: DeviceStatus, previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The ``status.devices`` entry of one allocated device: ``previous`` (what the claim shows)
    with ``status`` applied."""
    previous = previous or {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    written: dict[str, Any] = {k: result[k] for k in ("driver", "pool", "device", "shareID") if result.get(k)}
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
    new = {_key(e): e for e in entries}
    result = [new.pop(_key(d), dict(d)) for d in existing]
    return result + list(new.values())


async def after_prepare(
    cluster: Cluster,
    driver: str,
    resources: Mapping[str, Attached],
    answers: Mapping[str, object],
    refs: Sequence[tuple[str, str, str]],
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """The status of each claim of ``refs`` just prepared (its answer not an error), written within :data:`AFTER_PREPARE_TIMEOUT` when a
    backend of this driver has the hook; a failure is logged, never the claim's (its devices are
    prepared: the status only lacks their data)."""
    if not any(a.server.backend.implements(HOOK) for a in resources.values()):
        return
    for namespace, uid, name in refs:
        if isinstance(answers.get(uid), str):
            continue
        try:
            async with asyncio.timeout(AFTER_PREPARE_TIMEOUT):
                await write_status(cluster, driver, resources, (namespace, uid, name), prepared=True)
        except (ClusterError, HookError, TimeoutError) as exc:
            log.warning(
                "device status not written",
                claim=f"{namespace}/{name}",
                uid=uid,
                error=str(exc) or "timed out",
            )


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = claim.get("status", {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or ())


def _statuses(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(d) for d in claim.get("status", {}).get("devices") or ()]


def _key(device: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        device.get("driver", ""),
        device.get("pool", ""),
        device.get("device", ""),
        device.get("shareID") or "",
    )


def _find(statuses: Sequence[Mapping[str, Any]], result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((d for d in statuses if _key(d) == _key(result)), None)
