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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ContainerAllocation
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from devicehost.host.dra.cluster import Cluster, ClusterError
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
        """Each claim prepared (or as prepared before), or the one-line reason it is not."""
        answers: dict[str, PreparedClaim | str] = {}
        async with self._lock:  # one claim at a time: the checkpoint and holds change in order
            for namespace, uid, name in claims:
                try:
                    answers[uid] = self.checkpoint.claims.get(uid) or await self._prepare(
                        namespace, uid, name
                    )
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

    async def _prepare(self, namespace: str, uid: str, name: str) -> PreparedClaim:
        try:
            allocation = await self._cluster.claim(namespace, name)
        except ClusterError as exc:
            raise _ClaimRefused(f"reading ResourceClaim {namespace}/{name}: {exc}") from None
        if allocation.uid != uid:
            raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has UID {allocation.uid}, not {uid}")
        mine = [d for d in allocation.devices if d.driver == self._driver]
        if not mine:
            raise _ClaimRefused(f"ResourceClaim {namespace}/{name} has no devices of driver {self._driver}")
        by_pool = {a.pool: a for a in self._resources.values()}
        picked: dict[str, list[tuple[str, str, str]]] = {}  # resource -> (request, DRA name, device ID)
        for device in mine:
            attached = by_pool.get(device.pool)
            if attached is None:
                raise _ClaimRefused(f"pool {device.pool!r} is not served by this host")
            by_name = {names.device_name(d.id): d.id for d in attached.server.table.devices}
            if device.device not in by_name:
                raise _ClaimRefused(f"device {device.device!r} is not in pool {device.pool!r}")
            picked.setdefault(attached.server.name, []).append(
                (device.request, device.device, by_name[device.device])
            )
        devices: list[PreparedDevice] = []
        spec_devices: list[cdi.Device] = []
        kind = names.cdi_kind(self._driver, uid)
        for resource, chosen in picked.items():
            server = self._resources[resource].server
            ids = tuple(device_id for _, _, device_id in chosen)
            taken = self._device_plugin_holds(resource) & set(ids)
            if taken:
                raise _ClaimRefused(f"{resource}: {sorted(taken)} allocated through the device plugin")
            try:
                given = await server.backend.allocate(resource, ids)
            except HookError as exc:
                raise _ClaimRefused(str(exc)) from None
            cdi_ids = list(given.cdi_devices)
            edits = cdi.edits_from_allocation(given)
            if edits.to_dict():
                device_name = names.device_name(resource.partition("/")[2])
                spec_devices.append(cdi.Device(name=device_name, edits=edits))
                cdi_ids.append(f"{kind}={device_name}")
            for n, (request, dra_name, device_id) in enumerate(chosen):
                pool = self._resources[resource].pool
                handed = tuple(cdi_ids) if n == 0 else ()  # the claim's edits once, on its first device
                devices.append(PreparedDevice(request, pool, dra_name, resource, device_id, handed))
            _unused(given)
        if spec_devices:
            try:
                cdi.write_spec(cdi.Spec(kind=kind, devices=spec_devices))
            except (OSError, ValueError) as exc:
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
            cdi.remove_spec(names.cdi_kind(self._driver, uid))
        self.checkpoint.remove(uid)
        for resource, ids in claim.by_resource().items():
            self._resources[resource].server.table.hold(ids, HOLD, False)
        self.log.info("claim unprepared", claim=f"{claim.namespace}/{claim.name}", uid=uid)


class _ClaimRefused(Exception):
    """A claim cannot be prepared or unprepared; the message is the claim's error."""


def _unused(allocation: ContainerAllocation) -> None:
    """Annotations have no CDI edit and no place in the DRA answer: they are not passed on."""
    if allocation.annotations:
        log.debug(
            "allocation annotations are not passed on through DRA", annotations=list(allocation.annotations)
        )
