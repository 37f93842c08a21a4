"""Preparing and unpreparing one driver's claims: the kubelet's two DRA calls, as plain functions.

Prepare reads the claim's allocation from the API server, calls the backend's allocate hook once
per resource and request for the claim's devices (with the request's name, its opaque
configuration checked by the backend's model, and its admin access), writes what that gave as a
CDI spec of the claim's own (``<driver>/claim-<uid>``), and records the claim in the checkpoint
before answering; asked again, it answers the same. Unprepare calls the release hook for the
claim's devices that no other prepared claim takes (an admin-access claim may share a device
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
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.allocated import Attached, ClaimRefused, Found, Request, requests_of
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, by_resource
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


class Claims:
    """The claims of one driver: prepared through its backends, kept in its checkpoint."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        checkpoint: Checkpoint,
        resources: Mapping[str, Attached],
        context: HostContext | None = None,
    ) -> None:
        self._driver = driver
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
        self.specs = ClaimSpecs(driver, context, self.log)

    async def follow_cdi_dir(self) -> None:
        """Move the prepared claims' CDI specs to the host's ``cdi_dir`` if a reload changed it."""
        async with owned(self._lock, self.checkpoint, self._resources):
            self.specs.follow(self.checkpoint.claims)

    async def read(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimAllocation | BaseException]:
        """Those of ``claims`` not prepared yet, read from the API server at once (outside the
        lock, so one slow read does not hold the others), by UID: each claim is read once a call."""
        new = [ref for ref in claims if ref[1] not in self.checkpoint.claims]
        reads = await asyncio.gather(*(self._read(*ref) for ref in new), return_exceptions=True)
        return dict(zip((ref[1] for ref in new), reads, strict=True))

    async def prepare(
        self, claims: Sequence[ClaimRef], reads: Mapping[str, ClaimAllocation | BaseException] | None = None
    ) -> dict[str, PreparedClaim | str]:
        """Each claim prepared (or as prepared before), or the one-line reason it is not; ``reads`` as
        :meth:`read` gave them (read here when None). The checkpoint is written once for all."""
        allocations = await self.read(claims) if reads is None else reads
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
                    if isinstance(read, BaseException):
                        raise refusal(read, f"{namespace}/{name}")
                    prepared = await self._prepare(read)
                answers[uid] = prepared
            except ClaimRefused as exc:
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
                except ClaimRefused as exc:
                    self.log.error(
                        "claim not unprepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc)
                    )
                    errors[uid] = str(exc)
        return errors

    async def _prepare(self, read: ClaimAllocation) -> PreparedClaim:
        namespace, uid, name = read.namespace, read.uid, read.name
        kind = self.specs.kind(uid)
        asked = requests_of(read, self._driver, self._resources, self.tainted)
        with reserved(self._resources, asked, uid):
            devices, spec_devices = await self._allocate(kind, asked)
            if spec_devices:
                try:
                    self.specs.write(uid, spec_devices)
                except (OSError, ValueError) as exc:
                    await self._release(
                        devices, "its CDI spec could not be written", (f"{namespace}/{name}", uid)
                    )
                    raise ClaimRefused(f"CDI spec for the claim: {exc}") from None
            claim = PreparedClaim(uid, namespace, name, tuple(devices))
            self.checkpoint.add(claim)
            for resource, ids in claim.by_resource().items():
                hold(self._resources[resource].server, ids, True)
        self.prepared += 1
        self.log.info(
            "claim prepared", claim=f"{namespace}/{name}", uid=uid, devices=[d.device_id for d in devices]
        )
        return claim

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
            self.specs.remove(uid)
        self.checkpoint.remove(uid)
        still = self.checkpoint.held()
        for resource, ids in claim.by_resource().items():
            hold(self._resources[resource].server, [i for i in ids if (resource, i) not in still], False)
        self.log.info("claim unprepared", claim=f"{claim.namespace}/{claim.name}", uid=uid)


def prepared_devices(
    request: str, pool: str, resource: str, chosen: Sequence[Found], cdi_ids: tuple[str, ...]
) -> list[PreparedDevice]:
    """The request's devices as the checkpoint keeps them; the first carries the CDI IDs."""
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
    but: str,
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Call the release hook for ``devices`` that no prepared claim (``but`` left out) takes, and
    for every share among them (a share is the claim's own; ``claim`` is its name and UID).

    Used when a failed prepare gives back what it allocated (failures are logged: the claim
    fails anyway) and when the claim ``but`` is unprepared (failures raised: the kubelet asks again).
    """
    calls = release_calls(devices, checkpoint.held(but=but), claim)
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
    devices: Collection[PreparedDevice], taken: Collection[tuple[str, str]], claim: tuple[str, str]
) -> list[tuple[str, tuple[str, ...], ClaimRequest | None]]:
    """The release hook's calls for ``devices``: one per resource for the whole devices no other
    claim has ``taken``, then one per resource and request for the shares, with their claim request."""
    whole = by_resource(d for d in devices if not d.share and (d.resource, d.device_id) not in taken)
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
    the file has it, written once at the end (:meth:`Checkpoint.owned`). Another instance of the
    driver (a rolling update) may have prepared or unprepared claims meanwhile: the device plugin
    side's masks follow."""
    async with lock:
        before = checkpoint.held()
        async with checkpoint.owned():
            after = checkpoint.held()
            for masked, changed in ((True, after - before), (False, before - after)):
                for resource, ids in by_resource_ids(changed).items():
                    if resource in resources:
                        hold(resources[resource].server, ids, masked)
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
