"""Preparing and unpreparing one driver's claims: the kubelet's two DRA calls, as plain functions.

Prepare reads the claim's allocation from the API server, calls the backend's allocate hook once
per resource and request for the claim's devices (with the request's name, its opaque
configuration checked by the backend's model, and its admin access), writes what that gave as a
CDI spec of the claim's own (``<driver>/claim-<uid>``), and records the claim in the checkpoint
before answering; asked again, it answers the same (its spec on disk checked first). Unprepare
calls the release hook for the claim's devices that no other prepared claim takes (an
admin-access claim may share a device with a normal one), removes the spec and forgets the
claim. Each step is recorded in the checkpoint before it is taken (the claim's phase), so a
start after a kill replays from there (:mod:`.restore`); a prepare the kubelet made before an
unprepare of the same claim is refused (calls end as the kubelet's last). From the moment its devices are
picked until it is unprepared, a claim's devices are held through DRA in their resource's
inventory (:mod:`devicehost.host.inventory`), so a resource served through both APIs never gives
a device, or a counter's amount, out twice; a claim whose devices the device plugin side holds
(or would overdraw a counter set with) is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names, steps
from devicehost.host.dra.allocated import Attached, ClaimRefused, Found, Request, requests_of
from devicehost.host.dra.checkpoint import Checkpoint, Phase, PreparedClaim, PreparedDevice, by_resource
from devicehost.host.dra.cluster import ClaimAllocation, Cluster, ClusterError
from devicehost.host.dra.servicer import ClaimRef
from devicehost.host.dra.specs import ClaimSpecs
from devicehost.host.inventory import DRA

if TYPE_CHECKING:
    from devicehost.host.context import HostContext
    from devicehost.host.serving.resource import ResourceServer

log = structlog.get_logger(__name__)

HOLDER = "claims"
"""The holder of the prepared claims' devices in their resources' inventories."""
READS = 16
"""ResourceClaims read from the API server at once for one driver."""
READ_TIMEOUT = 10.0
"""Seconds one claim's read may take (the kubelet's own deadline for the call is 45 s)."""


class ClaimSteps:
    """Each step of preparing and unpreparing one claim of a driver, through its backends, its
    checkpoint and its CDI specs, recorded before it is taken (see :mod:`.steps`)."""

    def __init__(
        self,
        driver: str,
        checkpoint: Checkpoint,
        resources: Mapping[str, Attached],
        context: HostContext | None = None,
    ) -> None:
        self.driver = driver
        self.checkpoint = checkpoint
        self.resources = resources
        self.prepared = 0
        self.tainted = False
        """Unhealthy devices are published with a taint: the scheduler gave one only to a claim
        that tolerates it, so prepare takes it (else it was withdrawn, and is refused)."""
        self.log = log.bind(driver=driver)
        self.specs = ClaimSpecs(driver, context, self.log)

    def as_on_disk(self, claim: PreparedClaim) -> PreparedClaim:
        """``claim``, its CDI spec written again first where it is missing or differs: a prepare
        answer promises only what is on disk."""
        try:
            if self.specs.ensure(claim):
                self.log.warning(
                    "CDI spec of a prepared claim was missing or changed: written again",
                    claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid,
                )
        except (OSError, ValueError) as exc:
            raise ClaimRefused(f"CDI spec for the claim: {exc}") from None
        return claim

    async def _prepare(self, read: ClaimAllocation) -> PreparedClaim:
        namespace, uid, name = read.namespace, read.uid, read.name
        asked = requests_of(read, self.driver, self.resources, self.tainted)
        configs = {r.asked.name: parameters(self.driver, read, r.asked.name) for r in asked}
        planned = [
            d for r in asked for d in prepared_devices(r.asked.name, r.attached.pool, r.resource, r.found, ())
        ]
        with reserved(self.resources, asked, uid):
            self.checkpoint.add(
                PreparedClaim(uid, namespace, name, tuple(planned), Phase.PREPARING, None, configs)
            )
            self.checkpoint.flush()
            steps.reached(steps.PREPARE_RECORDED)
            try:
                claim = await self._allocate_and_write(read, asked, configs)
            except ClaimRefused:
                self.checkpoint.remove(uid)
                raise
            self.checkpoint.add(claim)
            for resource, ids in claim.by_resource().items():
                hold(self.resources[resource].server, ids, True)
        self.prepared += 1
        self.log.info(
            "claim prepared",
            claim=f"{namespace}/{name}",
            uid=uid,
            devices=[d.device_id for d in claim.devices],
        )
        return claim

    async def _allocate_and_write(
        self, read: ClaimAllocation, requests: Sequence[Request], configs: Mapping[str, Any]
    ) -> PreparedClaim:
        """The allocate hooks' answers as the claim's devices, and its CDI spec written."""
        named = (f"{read.namespace}/{read.name}", read.uid)
        kind = self.specs.kind(read.uid)
        devices, spec_devices = await self._allocate(kind, requests)
        steps.reached(steps.PREPARE_ALLOCATED)
        spec = cdi.Spec(kind=kind, devices=spec_devices) if spec_devices else None
        if spec is not None:
            try:
                self.specs.write(read.uid, spec_devices)
            except (OSError, ValueError) as exc:
                await self._release(devices, "its CDI spec could not be written", named)
                raise ClaimRefused(f"CDI spec for the claim: {exc}") from None
        steps.reached(steps.PREPARE_SPEC_WRITTEN)
        spec_json = spec.to_dict() if spec else None
        return PreparedClaim(
            read.uid, read.namespace, read.name, tuple(devices), Phase.PREPARED, spec_json, configs
        )

    async def _allocate(
        self, kind: str, requests: Sequence[Request]
    ) -> tuple[list[PreparedDevice], list[cdi.Device]]:
        """One allocate call per resource and request; what is allocated is released again if a
        later call fails. Each request's first device carries the CDI IDs its containers get."""
        devices: list[PreparedDevice] = []
        spec_devices: list[cdi.Device] = []
        for resource, attached, chosen, asked in requests:
            ids = tuple(p.device.id for p in chosen)
            try:
                given = await attached.server.backend.allocate(resource, ids, asked)
            except HookError as exc:
                await self._release(
                    devices, "a later allocation of the claim failed", (asked.claim, asked.uid)
                )
                raise ClaimRefused(str(exc)) from None
            spec_device, cdi_ids = cdi_answer(kind, asked.name, resource, given)
            spec_devices.extend([spec_device] if spec_device else [])
            devices.extend(prepared_devices(asked.name, attached.pool, resource, chosen, cdi_ids))
        return devices, spec_devices

    async def _release(self, devices: Collection[PreparedDevice], why: str, claim: tuple[str, str]) -> None:
        """Give back what a failed prepare of ``claim`` allocated (failures logged)."""
        await release_free(self.checkpoint, self.resources, devices, why, claim, self.log)

    async def undo(self, claim: PreparedClaim, why: str) -> None:
        """Unprepare ``claim`` whatever its phase: recorded ``unpreparing`` first, then its
        devices no other claim holds released (recorded ``released``: never twice), its spec
        removed, and it forgotten. Raises :class:`ClaimRefused` (the claim stays ``unpreparing``)
        when a release fails."""
        uid, named = claim.uid, (f"{claim.namespace}/{claim.name}", claim.uid)
        if claim.phase is not Phase.RELEASED:
            if claim.phase is not Phase.UNPREPARING:
                self.checkpoint.add(replace(claim, phase=Phase.UNPREPARING))
                self.checkpoint.flush()
            steps.reached(steps.UNPREPARE_RECORDED)
            await release_free(self.checkpoint, self.resources, claim.devices, why, named, self.log, but=uid)
            self.checkpoint.add(replace(claim, phase=Phase.RELEASED))
            self.checkpoint.flush()
            steps.reached(steps.UNPREPARE_RELEASED)
        with contextlib.suppress(ValueError):
            self.specs.remove(uid)
        steps.reached(steps.UNPREPARE_SPEC_REMOVED)
        self.checkpoint.remove(uid)
        for resource, ids in claim.by_resource().items():
            free = [i for i in ids if not self.checkpoint.holds((resource, i))]
            if resource in self.resources:
                hold(self.resources[resource].server, free, False)


class Claims(ClaimSteps):
    """The claims of one driver: prepared through its backends, kept in its checkpoint.

    Calls are served one at a time, in the order they took the lock; each carries the number of
    its arrival, so a prepare that the kubelet asked for before an unprepare of the same claim
    (a late retry racing the unprepare) is refused instead of preparing the claim again.
    """

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        checkpoint: Checkpoint,
        resources: Mapping[str, Attached],
        context: HostContext | None = None,
    ) -> None:
        super().__init__(driver, checkpoint, resources, context)
        self._cluster = cluster
        self.lock = asyncio.Lock()
        reads = asyncio.Semaphore(READS)
        self._read = functools.partial(read_bounded, reads, cluster, driver)
        self._arrivals = itertools.count()
        self._asked: dict[str, int] = {}
        """Claim UID -> arrival of the last prepare asking for it, while one runs."""
        self._unprepared_at: dict[str, int] = {}
        """Claim UID -> arrival of its last unprepare, while a prepare of it runs."""
        self.restored: set[str] = set()
        """Claims of the checkpoint replayed or restored since the start (:mod:`.restore`)."""
        self.restored_resources: set[str] = set()
        """Resources whose claims were restored (at their first attach)."""
        self.not_restored: dict[str, str] = {}
        """Claim UID -> why it could not be restored at the start (its devices were released)."""

    async def follow_cdi_dir(self) -> None:
        """Move the prepared claims' CDI specs to the host's ``cdi_dir`` if a reload changed it."""
        async with owned(self.lock, self.checkpoint, self.resources):
            self.specs.follow(self.checkpoint.claims)

    async def read(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimAllocation | BaseException]:
        """Those of ``claims`` not prepared yet, read from the API server at once (outside the
        lock, so one slow read does not hold the others), by UID: each claim is read once a call.
        The first step of a prepare: the call's arrival is taken here."""
        arrival = next(self._arrivals)
        self._asked.update((uid, arrival) for _, uid, _ in claims)
        new = [ref for ref in claims if not self._prepared(ref[1])]
        reads = await asyncio.gather(*(self._read(*ref) for ref in new), return_exceptions=True)
        return dict(zip((ref[1] for ref in new), reads, strict=True))

    async def prepare(
        self, claims: Sequence[ClaimRef], reads: Mapping[str, ClaimAllocation | BaseException] | None = None
    ) -> dict[str, PreparedClaim | str]:
        """Each claim prepared (or as prepared before, its spec on disk), or the one-line reason it
        is not; ``reads`` as :meth:`read` gave them (read here when None). The checkpoint is
        written before each claim's allocate hooks run and once more before the answer."""
        try:
            allocations = await self.read(claims) if reads is None else reads
            answers: dict[str, PreparedClaim | str] = {}
            async with owned(self.lock, self.checkpoint, self.resources):
                for namespace, uid, name in claims:
                    try:
                        answers[uid] = await self._prepare_one((namespace, uid, name), allocations.get(uid))
                    except ClaimRefused as exc:
                        self.log.error(
                            "claim not prepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc)
                        )
                        answers[uid] = str(exc)
                if self.checkpoint.flush():
                    steps.reached(steps.PREPARE_CHECKPOINTED)
        finally:
            for _, uid, _ in claims:
                self._asked.pop(uid, None)
            if not self._asked:
                self._unprepared_at.clear()
        return answers

    def _prepared(self, uid: str) -> bool:
        found = self.checkpoint.claims.get(uid)
        return found is not None and found.phase is Phase.PREPARED

    async def _prepare_one(
        self, ref: ClaimRef, read: ClaimAllocation | BaseException | None
    ) -> PreparedClaim:
        namespace, uid, name = ref
        found = self.checkpoint.claims.get(uid)
        if found is not None and found.phase is Phase.PREPARED:
            return self.as_on_disk(found)
        if self._unprepared_at.get(uid, -1) > self._asked.get(uid, -1):
            raise ClaimRefused(
                f"ResourceClaim {namespace}/{name} was unprepared after this prepare was asked for"
            )
        if found is not None:  # a call cut short (by another instance's crash): undone first
            await self.undo(found, "a call cut short is undone before the claim is prepared")
        if read is None:  # prepared when the reads began, unprepared since
            read = await self._read(namespace, uid, name)
        if isinstance(read, BaseException):
            raise refusal(read, f"{namespace}/{name}")
        return await self._prepare(read)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """For each claim, "" once unprepared (or never prepared), else the one-line reason."""
        arrival = next(self._arrivals)
        self._unprepared_at.update((uid, arrival) for _, uid, _ in claims if uid in self._asked)
        errors: dict[str, str] = {}
        async with owned(self.lock, self.checkpoint, self.resources):
            for namespace, uid, name in claims:
                try:
                    await self._unprepare(uid)
                    errors[uid] = ""
                except ClaimRefused as exc:
                    self.log.error(
                        "claim not unprepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc)
                    )
                    errors[uid] = str(exc)
            if self.checkpoint.flush():
                steps.reached(steps.UNPREPARE_CHECKPOINTED)
        return errors

    async def _unprepare(self, uid: str) -> None:
        claim = self.checkpoint.claims.get(uid)
        if claim is None:
            return  # never prepared here, or unprepared already: nothing to undo
        await self.undo(claim, "unprepared")
        self.log.info("claim unprepared", claim=f"{claim.namespace}/{claim.name}", uid=uid)


def parameters(driver: str, allocation: ClaimAllocation, request: str) -> object:
    """The request's opaque parameters for ``driver`` as the claim has them (None: none), kept in
    the checkpoint to check again and hand to the restore hook after a restart."""
    config = allocation.config(driver, request)
    return None if config is None else config.parameters


def prepared_devices(
    request: str, pool: str, resource: str, chosen: Sequence[Found], cdi_ids: tuple[str, ...]
) -> list[PreparedDevice]:
    """The request's devices as the checkpoint keeps them; the first carries the CDI IDs."""
    cdi_ids = tuple(dict.fromkeys(cdi_ids))  # each ID once, however the backend repeated it
    return [
        PreparedDevice(
            request,
            pool,
            p.allocated.device,
            resource,
            p.device.id,
            cdi_ids if n == 0 else (),
            p.allocated.admin_access,
            p.allocated.share_id,
            dict(p.allocated.consumed) if p.allocated.share_id else {},
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
    log: structlog.typing.FilteringBoundLogger,
    *,
    but: str = "",
) -> None:
    """Call the release hook for ``devices`` of ``claim`` (its name and UID) that no other claim
    in the checkpoint holds, and for every share among them (a share is the claim's own).

    Used when a failed prepare gives back what it allocated (failures are logged: the claim
    fails anyway) and when the claim ``but`` is unprepared (failures raised: the kubelet asks again).
    """
    uid = claim[1]
    calls = release_calls(devices, lambda key: checkpoint.holds(key, but=uid), claim)
    for resource, ids, shares in calls:
        attached = resources.get(resource)
        if attached is None:
            raise ClaimRefused(f"{resource} is not served right now; asked again later")
        try:
            await attached.server.backend.release(resource, ids, shares)
        except HookError as exc:
            if but:
                raise ClaimRefused(str(exc)) from None
            log.error("release after a failed prepare failed", resource=resource, error=str(exc))
    if calls and not but:
        log.warning("allocated devices released again", why=why, devices={r: ids for r, ids, _ in calls})


def release_calls(
    devices: Collection[PreparedDevice], held: Callable[[tuple[str, str]], bool], claim: tuple[str, str]
) -> list[tuple[str, tuple[str, ...], ClaimRequest | None]]:
    """The release hook's calls for ``devices``: one per resource for the whole devices no other
    claim holds (``held``), then one per resource and request for the shares, with their claim request."""
    whole = by_resource(d for d in devices if not d.share and not held((d.resource, d.device_id)))
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
    """One kubelet call owning the checkpoint (``lock``: one call of this host at a time): as
    the file has it, written at the end (:meth:`Checkpoint.owned`). Another instance of the
    driver (a rolling update) may have prepared or unprepared claims meanwhile: the device plugin
    side's holds follow."""
    async with lock, checkpoint.owned():
        for holding, changed in zip((True, False), checkpoint.moved, strict=True):
            for resource, ids in by_resource_ids(changed).items():
                if resource in resources:
                    hold(resources[resource].server, ids, holding)
        yield


def by_resource_ids(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(resource, device ID) pairs as device IDs by resource, sorted."""
    grouped: dict[str, list[str]] = {}
    for resource, device_id in sorted(pairs):
        grouped.setdefault(resource, []).append(device_id)
    return grouped


def hold(server: ResourceServer, ids: Collection[str], holding: bool) -> None:
    """Prepared claims hold ``ids`` through DRA in the resource's inventory (or no longer do):
    the device plugin side masks them and what they would overdraw."""
    server.table.hold(HOLDER, DRA, ids, holding)


@contextlib.contextmanager
def reserved(resources: Mapping[str, Attached], requests: Sequence[Request], uid: str) -> Iterator[None]:
    """Hold the devices of ``requests`` of the claim ``uid`` through DRA while it is prepared (the
    device plugin side cannot give them out meanwhile); refused, naming why, when the device plugin
    side holds one or they would overdraw a counter set with what both APIs hold."""
    ids: dict[str, list[str]] = {}
    for request in requests:
        ids.setdefault(request.resource, []).extend(f.device.id for f in request.found)
    tables = {resource: resources[resource].server.table for resource in ids}
    for resource, wanted in ids.items():
        problem = tables[resource].view().refusal(DRA, wanted)
        if problem:
            raise ClaimRefused(f"{resource}: {problem}")
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
            raise ClaimRefused(
                f"reading ResourceClaim {namespace}/{name}: no answer within {READ_TIMEOUT:g} s"
            ) from None


async def read_claim(cluster: Cluster, driver: str, namespace: str, uid: str, name: str) -> ClaimAllocation:
    """The claim, from the API server; refused unless it is the one named and has devices of ``driver``."""
    try:
        allocation = await cluster.claim(namespace, name)
    except ClusterError as exc:
        raise ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
    if allocation.uid != uid:
        raise ClaimRefused(f"ResourceClaim {namespace}/{name} has UID {allocation.uid}, not {uid}")
    if not allocation.devices_of(driver):
        raise ClaimRefused(f"ResourceClaim {namespace}/{name} has no devices of driver {driver}")
    return replace(allocation, namespace=namespace, name=name)


def refusal(read: BaseException, claim: str) -> ClaimRefused:
    """What a failed read of ``claim`` answers the kubelet."""
    if isinstance(read, ClaimRefused):
        return read
    return ClaimRefused(f"reading ResourceClaim {claim}: {read!r}")


def _say_annotations_dropped(allocation: ContainerAllocation) -> None:
    """Annotations have no CDI edit and no place in the DRA answer: they are not passed on."""
    if allocation.annotations:
        log.debug(
            "allocation annotations are not passed on through DRA", annotations=list(allocation.annotations)
        )
