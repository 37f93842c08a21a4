"""Preparing and unpreparing one driver's claims: the kubelet's two DRA calls, as plain functions.

Prepare reads the claim's allocation from the API server, calls the backend's allocate hook once
per resource for the claim's devices, writes what that gave as a CDI spec of the claim's own
(``<driver>/claim-<uid>``), and records the claim in the checkpoint before answering; asked
again, it answers the same. Unprepare calls the release hook, removes the spec and forgets the
claim. While prepared, a device is advertised Unhealthy to the device plugin side, so a resource
served through both APIs never hands one device out twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ContainerAllocation, Device, Health
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, by_resource
from devicehost.host.dra.cluster import AllocatedDevice, Cluster, ClusterError
from devicehost.host.dra.servicer import ClaimRef

if TYPE_CHECKING:
    from devicehost.host.serving.resource import ResourceServer

log = structlog.get_logger(__name__)

HOLD = "dra"
"""The reason prepared devices are held on the device plugin side."""


@dataclass
class Attached:
    """A resource served through a driver: its server, pool and slice, and the task publishing it."""

    server: ResourceServer
    pool: str
    slice: str
    follow: asyncio.Task[None]


def _cdi_dir(attached: Mapping[str, Attached], resources: Iterable[str]) -> Path | None:
    """The host's ``cdi_dir``, as it hands it to the backends serving ``resources``."""
    served = [attached[r] for r in resources if r in attached]
    return served[0].server.backend.cdi_dir if served else None


class Claims:
    """The claims of one driver: prepared through its backends, kept in its checkpoint."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        checkpoint: Checkpoint,
        resources: Mapping[str, Attached],
        device_plugin_holds: Callable[[str], frozenset[str]],
    ) -> None:
        self._driver = driver
        self._cluster = cluster
        self.checkpoint = checkpoint
        self._resources = resources
        self._device_plugin_holds = device_plugin_holds
        self._lock = asyncio.Lock()
        self.prepared = 0
        self.log = log.bind(driver=driver)

    def held(self, resource: str) -> tuple[str, ...]:
        """Device IDs of ``resource`` in prepared claims."""
        return tuple(i for c in self.checkpoint.claims.values() for i in c.by_resource().get(resource, ()))

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Each claim prepared (or as prepared before), or the one-line reason it is not.

        The claims are read from the API server at once, outside the lock, so one slow read does
        not hold the others; then they are prepared one at a time (the checkpoint changes in order).
        """
        new = [ref for ref in claims if ref[1] not in self.checkpoint.claims]
        reads = await asyncio.gather(
            *(read_claim(self._cluster, self._driver, *ref) for ref in new), return_exceptions=True
        )
        allocations = dict(zip((ref[1] for ref in new), reads, strict=True))
        answers: dict[str, PreparedClaim | str] = {}
        async with self._lock:
            for namespace, uid, name in claims:
                try:
                    prepared = self.checkpoint.claims.get(uid)
                    if prepared is None:
                        read = allocations.get(uid)
                        if read is None:  # prepared when the reads began, unprepared since
                            read = await read_claim(self._cluster, self._driver, namespace, uid, name)
                        prepared = await self._prepare(namespace, uid, name, read)
                    answers[uid] = prepared
                except _ClaimRefused as exc:
                    self.log.error("claim not prepared", claim=f"{namespace}/{name}", uid=uid, error=str(exc))
                    answers[uid] = str(exc)
        return answers

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """For each claim, "" once unprepared (or never prepared), else the one-line reason."""
        errors: dict[str, str] = {}
        async with self._lock:
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
        self, namespace: str, uid: str, name: str, read: tuple[AllocatedDevice, ...] | BaseException
    ) -> PreparedClaim:
        if isinstance(read, BaseException):
            if isinstance(read, _ClaimRefused):
                raise read
            raise _ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {read!r}") from None
        kind = names.cdi_kind(self._driver, uid)
        devices, spec_devices = await self._allocate(
            kind, pick(read, self._resources, self._device_plugin_holds)
        )
        if spec_devices:
            try:
                cdi.write_spec(
                    cdi.Spec(kind=kind, devices=spec_devices), _cdi_dir(self._resources, by_resource(devices))
                )
            except (OSError, ValueError) as exc:
                await self._release(by_resource(devices), "its CDI spec could not be written")
                raise _ClaimRefused(f"CDI spec for the claim: {exc}") from None
        claim = PreparedClaim(uid, namespace, name, tuple(devices))
        self.checkpoint.add(claim)
        for resource, held in claim.by_resource().items():
            self._resources[resource].server.table.hold(held, HOLD, True)
        self.prepared += 1
        self.log.info(
            "claim prepared", claim=f"{namespace}/{name}", uid=uid, devices=[d.device_id for d in devices]
        )
        return claim

    async def _allocate(
        self, kind: str, picked: Mapping[tuple[str, str], list[tuple[str, str]]]
    ) -> tuple[list[PreparedDevice], list[cdi.Device]]:
        """One allocate call per resource and request; what is allocated is released again if a
        later call fails. Each request's first device carries the CDI IDs its containers get."""
        devices: list[PreparedDevice] = []
        spec_devices: list[cdi.Device] = []
        for (resource, request), chosen in picked.items():
            attached = self._resources[resource]
            ids = tuple(device_id for _, device_id in chosen)
            try:
                given = await attached.server.backend.allocate(resource, ids)
            except HookError as exc:
                await self._release(by_resource(devices), "a later allocation of the claim failed")
                raise _ClaimRefused(str(exc)) from None
            _say_annotations_dropped(given)
            cdi_ids = list(given.cdi_devices)
            edits = cdi.edits_from_allocation(given)
            if edits.to_dict():
                cdi_name = f"{request}.{names.device_name(resource.partition('/')[2])}"
                spec_devices.append(cdi.Device(name=cdi_name, edits=edits))
                cdi_ids.append(f"{kind}={cdi_name}")
            for n, (dra_name, device_id) in enumerate(chosen):
                handed = tuple(cdi_ids) if n == 0 else ()
                devices.append(PreparedDevice(request, attached.pool, dra_name, resource, device_id, handed))
        return devices, spec_devices

    async def _release(self, by_resource: Mapping[str, tuple[str, ...]], why: str) -> None:
        """Give back what a failed prepare had allocated (failures logged: the claim fails anyway)."""
        for resource, ids in by_resource.items():
            try:
                await self._resources[resource].server.backend.release(resource, ids)
            except HookError as exc:
                self.log.error("release after a failed prepare failed", resource=resource, error=str(exc))
        if by_resource:
            self.log.warning("allocated devices released again", why=why, devices=dict(by_resource))

    async def _unprepare(self, uid: str) -> None:
        claim = self.checkpoint.claims.get(uid)
        if claim is None:
            return  # never prepared here, or unprepared already: nothing to undo
        for resource, ids in claim.by_resource().items():
            attached = self._resources.get(resource)
            if attached is None:
                raise _ClaimRefused(f"{resource} is not served right now; asked again later")
            try:
                await attached.server.backend.release(resource, ids)
            except HookError as exc:
                raise _ClaimRefused(str(exc)) from None
        with contextlib.suppress(ValueError):
            cdi.remove_spec(names.cdi_kind(self._driver, uid), _cdi_dir(self._resources, claim.by_resource()))
        self.checkpoint.remove(uid)
        for resource, ids in claim.by_resource().items():
            self._resources[resource].server.table.hold(ids, HOLD, False)
        self.log.info("claim unprepared", claim=f"{claim.namespace}/{claim.name}", uid=uid)


async def read_claim(
    cluster: Cluster, driver: str, namespace: str, uid: str, name: str
) -> tuple[AllocatedDevice, ...]:
    """The claim's devices of this driver, from the API server."""
    try:
        allocation = await cluster.claim(namespace, name)
    except ClusterError as exc:
        raise _ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
    if allocation.uid != uid:
        raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has UID {allocation.uid}, not {uid}")
    mine = tuple(d for d in allocation.devices if d.driver == driver)
    if not mine:
        raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has no devices of driver {driver}")
    return mine


def pick(
    allocated: Sequence[AllocatedDevice],
    resources: Mapping[str, Attached],
    device_plugin_holds: Callable[[str], frozenset[str]],
) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """The allocated devices by (resource, request): (DRA name, device ID) each, checked."""
    by_pool = {a.pool: a for a in resources.values()}
    named: dict[str, dict[str, Device]] = {}  # pool -> DRA device name -> device, built once a pool
    picked: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for device in allocated:
        attached = by_pool.get(device.pool)
        if attached is None:
            raise _ClaimRefused(f"pool {device.pool!r} is not served by this host")
        if device.pool not in named:
            named[device.pool] = {names.device_name(d.id): d for d in attached.server.table.devices}
        found = named[device.pool].get(device.device)
        if found is None:
            raise _ClaimRefused(f"device {device.device!r} is not in pool {device.pool!r}")
        if found.health is not Health.HEALTHY:  # asked again by the kubelet: it may recover
            raise _ClaimRefused(f"device {device.device!r} of pool {device.pool!r} is unhealthy")
        resource = attached.server.name
        if found.id in device_plugin_holds(resource):
            raise _ClaimRefused(f"{resource}: {found.id!r} is allocated through the device plugin")
        picked.setdefault((resource, device.request), []).append((device.device, found.id))
    return picked


class _ClaimRefused(Exception):
    """A claim cannot be prepared or unprepared; the message is the claim's error."""


def _say_annotations_dropped(allocation: ContainerAllocation) -> None:
    """Annotations have no CDI edit and no place in the DRA answer: they are not passed on."""
    if allocation.annotations:
        log.debug(
            "allocation annotations are not passed on through DRA", annotations=list(allocation.annotations)
        )
