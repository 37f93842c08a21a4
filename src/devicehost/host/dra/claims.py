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

Here is the order of the steps; :mod:`.allocated` finds and holds a claim's devices,
:mod:`.hooks` calls the backend's hooks for them, and :mod:`.specs` writes the claim's spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from devicehost.host.dra import hooks, steps
from devicehost.host.dra.allocated import Attached, ClaimRefused, hold, requests_of, reserved
from devicehost.host.dra.checkpoint import Checkpoint, Phase, PreparedClaim
from devicehost.host.dra.cluster import ClaimAllocation, Cluster, ClusterError
from devicehost.host.dra.servicer import ClaimRef
from devicehost.host.dra.specs import ClaimSpecs

if TYPE_CHECKING:
    from devicehost.host.context import HostContext

log = structlog.get_logger(__name__)

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
        """Prepare the claim ``read``: its devices found and reserved, the claim recorded
        ``preparing``, the allocate hooks called, its CDI spec written, and the claim recorded
        ``prepared`` (its devices then held with the prepared claims)."""
        namespace, uid, name = read.namespace, read.uid, read.name
        requests = requests_of(read, self.driver, self.resources, self.tainted)
        configs = {r.asked.name: r.parameters for r in requests}
        planned = tuple(d for r in requests for d in r.planned)
        with reserved(requests, uid):
            self.checkpoint.add(PreparedClaim(uid, namespace, name, planned, Phase.PREPARING, None, configs))
            self.checkpoint.flush()
            steps.reached(steps.PREPARE_RECORDED)
            try:
                async with hooks.allocated(requests, self.checkpoint, self.resources, self.log) as given:
                    steps.reached(steps.PREPARE_ALLOCATED)
                    devices, spec = self.specs.written(uid, requests, given)
                    steps.reached(steps.PREPARE_SPEC_WRITTEN)
            except ClaimRefused:
                self.checkpoint.remove(uid)
                raise
            claim = PreparedClaim(uid, namespace, name, devices, Phase.PREPARED, spec, configs)
            self.checkpoint.add(claim)
        self.prepared += 1
        self.log.info(
            "claim prepared", claim=f"{namespace}/{name}", uid=uid, devices=[d.device_id for d in devices]
        )
        return claim

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
            await hooks.release_free(
                self.checkpoint, self.resources, claim.devices, why, named, self.log, but=uid
            )
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
