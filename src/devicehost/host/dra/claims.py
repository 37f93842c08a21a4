"""Preparing and unpreparing one driver's claims: the kubelet's two DRA calls, as plain functions.

Prepare reads the claim's allocation from the API server, calls the backend's allocate hook once
per resource and request for the claim's devices (with the request's name, its opaque
configuration checked by the backend's model, and its admin access), writes what that gave as a
CDI spec of the claim's own (``<driver>/claim-<uid>``), and records the claim in the checkpoint
before answering; asked again, it answers the same. Unprepare calls the release hook for the
claim's devices that no other prepared claim holds (an admin-access claim may share a device
with a normal one), removes the spec and forgets the claim. From the moment its devices are
picked until it is unprepared, a claim's devices are held through DRA in their resource's
inventory (:mod:`devicehost.host.inventory`), so a resource served through both APIs never gives
a device, or a counter's amount, out twice; a claim whose devices the device plugin side holds
(or would overdraw a counter set with) is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, Device, Health, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, by_resource
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, Cluster, ClusterError
from devicehost.host.dra.servicer import ClaimRef
from devicehost.host.inventory import DRA

if TYPE_CHECKING:
    from devicehost.host.serving.resource import ResourceServer

log = structlog.get_logger(__name__)

HOLDER = "claims"
"""The holder of the prepared claims' devices in their resources' inventories."""
READS = 16
"""ResourceClaims read from the API server at once for one driver."""
READ_TIMEOUT = 10.0
"""Seconds one claim's read may take (the kubelet's own deadline for the call is 45 s)."""


@dataclass
class Attached:
    """A resource served through a driver: its server, pool and slice, and the task publishing it."""

    server: ResourceServer
    pool: str
    slice: str
    follow: asyncio.Task[None]


@dataclass(frozen=True)
class Picked:
    """One allocated device of a claim, found in what this host publishes."""

    device: str
    """Its DRA name."""
    device_id: str
    admin_access: bool
    share: Share | None = None
    """Its share, on a device that allows multiple allocations."""


class Claims:
    """The claims of one driver: prepared through its backends, kept in its checkpoint."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        checkpoint: Checkpoint,
        resources: Mapping[str, Attached],
        cdi_dir: Path | None = None,
    ) -> None:
        self._driver = driver
        self._cdi_dir = cdi_dir
        """Where the claims' CDI specs go: the host's ``cdi_dir`` (None: ``devicehost.cdi``'s default)."""
        self._cluster = cluster
        self.checkpoint = checkpoint
        self._resources = resources
        self._lock = asyncio.Lock()
        reads = asyncio.Semaphore(READS)
        self._read = functools.partial(read_bounded, reads, cluster, driver)
        self.prepared = 0
        self.tainted = False
        """Unhealthy devices are published with a taint: the scheduler gave one only to a claim
        that tolerates it, so prepare takes it (else it was withdrawn, and is refused)."""
        self.log = log.bind(driver=driver)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Each claim prepared (or as prepared before), or the one-line reason it is not.

        The claims are read from the API server at once, outside the lock, so one slow read does
        not hold the others; then they are prepared one at a time, and the checkpoint is written
        once for all of them before the kubelet gets the answer.
        """
        new = [ref for ref in claims if ref[1] not in self.checkpoint.claims]
        reads = await asyncio.gather(*(self._read(*ref) for ref in new), return_exceptions=True)
        allocations = dict(zip((ref[1] for ref in new), reads, strict=True))
        answers: dict[str, PreparedClaim | str] = {}
        async with owned(self._lock, self.checkpoint, self._resources):
            await self._prepare_all(claims, allocations, answers)
        return answers

    async def _prepare_all(
        self,
        claims: Sequence[ClaimRef],
        allocations: Mapping[str, ClaimAllocation | BaseException],
        answers: dict[str, PreparedClaim | str],
    ) -> None:
        for namespace, uid, name in claims:
            try:
                prepared = self.checkpoint.claims.get(uid)
                if prepared is None:
                    read = allocations.get(uid)
                    if read is None:  # prepared when the reads began, unprepared since
                        read = await self._read(namespace, uid, name)
                    prepared = await self._prepare(namespace, uid, name, read)
                answers[uid] = prepared
            except _ClaimRefused as exc:
                self.log.error("claim not prepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc))
                answers[uid] = str(exc)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """For each claim, "" once unprepared (or never prepared), else the one-line reason."""
        errors: dict[str, str] = {}
        async with owned(self._lock, self.checkpoint, self._resources):
            for namespace, uid, name in claims:
                try:
                    await self._unprepare(uid)
                    errors[uid] = ""
                except _ClaimRefused as exc:
                    self.log.error(
                        "claim not unprepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc)
                    )
                    errors[uid] = str(exc)
        return errors

    async def _prepare(
        self, namespace: str, uid: str, name: str, read: ClaimAllocation | BaseException
    ) -> PreparedClaim:
        if isinstance(read, BaseException):
            if isinstance(read, _ClaimRefused):
                raise read
            raise _ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {read!r}") from None
        kind = names.cdi_kind(self._driver, uid)
        picked = pick(read.devices, self._resources, self.tainted)
        with reserved(self._resources, picked, uid):
            devices, spec_devices = await self._allocate(kind, f"{namespace}/{name}", uid, read, picked)
            if spec_devices:
                try:
                    cdi.write_spec(cdi.Spec(kind=kind, devices=spec_devices), self._cdi_dir)
                except (OSError, ValueError) as exc:
                    await self._release(
                        devices, "its CDI spec could not be written", (f"{namespace}/{name}", uid)
                    )
                    raise _ClaimRefused(f"CDI spec for the claim: {exc}") from None
            claim = PreparedClaim(uid, namespace, name, tuple(devices))
            self.checkpoint.add(claim)
            for resource, held in claim.by_resource().items():
                hold(self._resources[resource].server, held, True)
        self.prepared += 1
        self.log.info(
            "claim prepared", claim=f"{namespace}/{name}", uid=uid, devices=[d.device_id for d in devices]
        )
        return claim

    async def _allocate(
        self,
        kind: str,
        claim: str,
        uid: str,
        allocation: ClaimAllocation,
        picked: Mapping[tuple[str, str], list[Picked]],
    ) -> tuple[list[PreparedDevice], list[cdi.Device]]:
        """One allocate call per resource and request; what is allocated is released again if a
        later call fails. Each request's first device carries the CDI IDs its containers get."""
        devices: list[PreparedDevice] = []
        spec_devices: list[cdi.Device] = []
        for (resource, request), chosen in picked.items():
            attached = self._resources[resource]
            ids = tuple(p.device_id for p in chosen)
            try:
                asked = claim_request(self._driver, attached, allocation, request, chosen, (claim, uid))
                given = await attached.server.backend.allocate(resource, ids, asked)
            except (HookError, _ClaimRefused) as exc:
                await self._release(devices, "a later allocation of the claim failed", (claim, uid))
                raise _ClaimRefused(str(exc)) from None
            spec_device, cdi_ids = cdi_answer(kind, request, resource, given)
            spec_devices.extend([spec_device] if spec_device else [])
            devices.extend(prepared_devices(request, attached.pool, resource, chosen, cdi_ids))
        return devices, spec_devices

    async def _release(
        self, devices: Collection[PreparedDevice], why: str, claim: tuple[str, str], but: str = ""
    ) -> None:
        await release_free(self.checkpoint, self._resources, devices, why, claim, but, self.log)

    async def _unprepare(self, uid: str) -> None:
        claim = self.checkpoint.claims.get(uid)
        if claim is None:
            return  # never prepared here, or unprepared already: nothing to undo
        await self._release(claim.devices, "unprepared", (f"{claim.namespace}/{claim.name}", uid), but=uid)
        with contextlib.suppress(ValueError):
            cdi.remove_spec(names.cdi_kind(self._driver, uid), self._cdi_dir)
        self.checkpoint.remove(uid)
        still = self.checkpoint.held()
        for resource, ids in claim.by_resource().items():
            hold(self._resources[resource].server, [i for i in ids if (resource, i) not in still], False)
        self.log.info("claim unprepared", claim=f"{claim.namespace}/{claim.name}", uid=uid)


def claim_request(
    driver: str,
    attached: Attached,
    allocation: ClaimAllocation,
    request: str,
    chosen: Sequence[Picked],
    claim: tuple[str, str],
) -> ClaimRequest:
    """What the allocate hook gets for ``request``: its configuration, admin access and shares."""
    config = request_config(driver, attached, allocation, request)
    admin = any(p.admin_access for p in chosen)
    shares = {p.device_id: p.share for p in chosen if p.share is not None}
    return ClaimRequest(request, claim[0], claim[1], config, admin, shares)


def request_config(driver: str, attached: Attached, allocation: ClaimAllocation, request: str) -> object:
    """The request's opaque configuration for ``driver``, checked by the backend's model."""
    config = allocation.config(driver, request)
    if config is None:
        return None
    try:
        return attached.server.backend.claim_config(config.parameters, "parameters")
    except HookError as exc:
        raise _ClaimRefused(f"request {request!r}: {exc}") from None


def prepared_devices(
    request: str, pool: str, resource: str, chosen: Sequence[Picked], cdi_ids: tuple[str, ...]
) -> list[PreparedDevice]:
    """The request's devices as the checkpoint keeps them; the first carries the CDI IDs."""
    return [
        PreparedDevice(
            request,
            pool,
            p.device,
            resource,
            p.device_id,
            cdi_ids if n == 0 else (),
            p.admin_access,
            p.share.id if p.share else "",
            dict(p.share.consumed) if p.share else {},
        )
        for n, p in enumerate(chosen)
    ]


def cdi_answer(
    kind: str, request: str, resource: str, given: ContainerAllocation
) -> tuple[cdi.Device | None, tuple[str, ...]]:
    """The CDI device of the claim's spec that ``given``'s edits become (None: no edits), and the
    CDI IDs the request's containers get: the backend's own, then that device."""
    _say_annotations_dropped(given)
    edits = cdi.edits_from_allocation(given)
    if not edits.to_dict():
        return None, tuple(given.cdi_devices)
    name = names.cdi_device_name(request, resource)
    return cdi.Device(name=name, edits=edits), (*given.cdi_devices, f"{kind}={name}")


async def release_free(
    checkpoint: Checkpoint,
    resources: Mapping[str, Attached],
    devices: Collection[PreparedDevice],
    why: str,
    claim: tuple[str, str],
    but: str,
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Call the release hook for ``devices`` that no prepared claim (``but`` left out) holds, and
    for every share among them (a share is the claim's own; ``claim`` is its name and UID).

    Used when a failed prepare gives back what it allocated (failures are logged: the claim
    fails anyway) and when the claim ``but`` is unprepared (failures raised: the kubelet asks again).
    """
    calls = release_calls(devices, checkpoint.held(but=but), claim)
    for resource, ids, shares in calls:
        attached = resources.get(resource)
        if attached is None:
            raise _ClaimRefused(f"{resource} is not served right now; asked again later")
        try:
            await attached.server.backend.release(resource, ids, shares)
        except HookError as exc:
            if but:
                raise _ClaimRefused(str(exc)) from None
            log.error("release after a failed prepare failed", resource=resource, error=str(exc))
    if calls and not but:
        log.warning("allocated devices released again", why=why, devices={r: ids for r, ids, _ in calls})


def release_calls(
    devices: Collection[PreparedDevice], held: Collection[tuple[str, str]], claim: tuple[str, str]
) -> list[tuple[str, tuple[str, ...], ClaimRequest | None]]:
    """The release hook's calls for ``devices``: one per resource for the whole devices no other
    claim ``held``, then one per resource and request for the shares, with their claim request."""
    whole = by_resource(d for d in devices if not d.share and (d.resource, d.device_id) not in held)
    calls: list[tuple[str, tuple[str, ...], ClaimRequest | None]] = [
        (resource, ids, None) for resource, ids in whole.items()
    ]
    by_request: dict[tuple[str, str], list[PreparedDevice]] = {}
    for device in devices:
        if device.share:
            by_request.setdefault((device.resource, device.request), []).append(device)
    for (resource, request), shared in by_request.items():
        shares = {d.device_id: Share(d.share, d.consumed) for d in shared}
        asked = ClaimRequest(request, claim[0], claim[1], admin_access=shared[0].admin_access, shares=shares)
        calls.append((resource, tuple(shares), asked))
    return calls


@contextlib.asynccontextmanager
async def owned(
    lock: asyncio.Lock, checkpoint: Checkpoint, resources: Mapping[str, Attached]
) -> AsyncIterator[None]:
    """One kubelet call's hold of the checkpoint (``lock``: one call of this host at a time): as
    the file has it, written once at the end (:meth:`Checkpoint.owned`). Another instance of the
    driver (a rolling update) may have prepared or unprepared claims meanwhile: the device plugin
    side's holds follow."""
    async with lock:
        before = checkpoint.held()
        async with checkpoint.owned():
            after = checkpoint.held()
            for holding, changed in ((True, after - before), (False, before - after)):
                for resource, ids in by_resource_ids(changed).items():
                    if resource in resources:
                        hold(resources[resource].server, ids, holding)
            yield


def by_resource_ids(held: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(resource, device ID) pairs as device IDs by resource, sorted."""
    grouped: dict[str, list[str]] = {}
    for resource, device_id in sorted(held):
        grouped.setdefault(resource, []).append(device_id)
    return grouped


def hold(server: ResourceServer, ids: Collection[str], holding: bool) -> None:
    """Prepared claims hold ``ids`` through DRA in the resource's inventory (or no longer do):
    the device plugin side masks them and what they would overdraw."""
    server.table.hold(HOLDER, DRA, ids, holding)


@contextlib.contextmanager
def reserved(
    resources: Mapping[str, Attached], picked: Mapping[tuple[str, str], Sequence[Picked]], uid: str
) -> Iterator[None]:
    """Hold the ``picked`` devices of the claim ``uid`` through DRA while it is prepared (the
    device plugin side cannot give them out meanwhile); refused, naming why, when the device plugin
    side holds one or they would overdraw a counter set with what both APIs hold."""
    ids: dict[str, list[str]] = {}
    for (resource, _), chosen in picked.items():
        ids.setdefault(resource, []).extend(p.device_id for p in chosen)
    tables = {resource: resources[resource].server.table for resource in ids}
    for resource, wanted in ids.items():
        problem = tables[resource].view().refusal(DRA, wanted)
        if problem:
            raise _ClaimRefused(f"{resource}: {problem}")
    holder = f"claim {uid}"
    for resource, wanted in ids.items():
        tables[resource].hold(holder, DRA, wanted)
    try:
        yield
    finally:
        for resource, wanted in ids.items():
            tables[resource].hold(holder, DRA, wanted, False)


async def read_bounded(
    reads: asyncio.Semaphore, cluster: Cluster, driver: str, namespace: str, uid: str, name: str
) -> ClaimAllocation:
    """:func:`read_claim`, at most :data:`READS` at once (``reads``) and within
    :data:`READ_TIMEOUT`: a kubelet asking for thousands of claims in one call does not open
    thousands of requests, and an API server that does not answer fails that claim, not the call."""
    async with reads:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                return await read_claim(cluster, driver, namespace, uid, name)
        except TimeoutError:
            raise _ClaimRefused(
                f"reading ResourceClaim {namespace}/{name}: no answer within {READ_TIMEOUT:g} s"
            ) from None


async def read_claim(cluster: Cluster, driver: str, namespace: str, uid: str, name: str) -> ClaimAllocation:
    """The claim's allocation with only this driver's devices, from the API server."""
    try:
        allocation = await cluster.claim(namespace, name)
    except ClusterError as exc:
        raise _ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
    if allocation.uid != uid:
        raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has UID {allocation.uid}, not {uid}")
    mine = tuple(d for d in allocation.devices if d.driver == driver)
    if not mine:
        raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has no devices of driver {driver}")
    return replace(allocation, devices=mine)


def pick(
    allocated: Sequence[AllocatedDevice], resources: Mapping[str, Attached], tainted: bool = False
) -> dict[tuple[str, str], list[Picked]]:
    """The allocated devices by (resource, request), each found and checked; an unhealthy one only
    where it is ``tainted`` (published with a taint the claim must have tolerated)."""
    by_pool = {a.pool: a for a in resources.values()}
    named: dict[str, dict[str, Device]] = {}  # pool -> DRA device name -> device, built once a pool
    picked: dict[tuple[str, str], list[Picked]] = {}
    for device in allocated:
        attached = by_pool.get(device.pool)
        if attached is None:
            raise _ClaimRefused(f"pool {device.pool!r} is not served by this host")
        if device.pool not in named:
            named[device.pool] = {names.device_name(d.id): d for d in attached.server.table.devices}
        found = named[device.pool].get(device.device)
        if found is None:
            raise _ClaimRefused(f"device {device.device!r} is not in pool {device.pool!r}")
        if found.health is not Health.HEALTHY and not tainted:  # asked again: it may recover
            raise _ClaimRefused(f"device {device.device!r} of pool {device.pool!r} is unhealthy")
        resource = attached.server.name
        share = Share(device.share_id, device.consumed) if device.share_id else None
        same = picked.setdefault((resource, device.request), [])
        if any(p.device == device.device for p in same):
            raise _ClaimRefused(f"device {device.device!r} is allocated twice to request {device.request!r}")
        same.append(Picked(device.device, found.id, device.admin_access, share))
    return picked


class _ClaimRefused(Exception):
    """A claim cannot be prepared or unprepared; the message is the claim's error."""


def _say_annotations_dropped(allocation: ContainerAllocation) -> None:
    """Annotations have no CDI edit and no place in the DRA answer: they are not passed on."""
    if allocation.annotations:
        log.debug(
            "allocation annotations are not passed on through DRA", annotations=list(allocation.annotations)
        )
