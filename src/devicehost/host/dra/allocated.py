"""A claim's devices as this host serves them, the claim request a backend gets for them, and
their holds in their resources' inventories.

Prepare, claim status and binding conditions share these: :func:`located` finds each allocated
device in the pool that publishes it (one lookup), :func:`claim_request` makes the
:class:`~devicehost.ClaimRequest` a hook gets for one resource and request (one builder). A
request whose configuration the backend's model refuses fails the claim
(:class:`ClaimRefused`): prepare answers the error, and no status is written for it. While a
claim is prepared its devices are held through DRA (:func:`reserved`, then :func:`hold`), so the
device plugin side of a resource served through both APIs cannot give them out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from devicehost.hookspecs.types import ClaimRequest, Device, Health, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import PreparedDevice
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation
from devicehost.host.inventory import DRA

if TYPE_CHECKING:
    from devicehost.host.serving.resource import ResourceServer

HOLDER = "claims"
"""The holder of the prepared claims' devices in their resources' inventories."""


class ClaimRefused(Exception):
    """A claim cannot be prepared or unprepared; the message is the claim's error."""


@dataclass
class Attached:
    """A resource served through a driver: its server, pool and slice, and the task publishing it."""

    server: ResourceServer
    pool: str
    slice: str
    follow: asyncio.Task[None]


@dataclass(frozen=True, eq=False)
class Found:
    """One allocated device of a claim, found in a pool this host publishes (hashed by identity)."""

    allocated: AllocatedDevice
    attached: Attached
    device: Device

    @property
    def share(self) -> Share | None:
        """Its share, on a device that allows multiple allocations."""
        allocated = self.allocated
        return Share(allocated.share_id, allocated.consumed) if allocated.share_id else None


def located(
    allocated: Iterable[AllocatedDevice], resources: Mapping[str, Attached]
) -> Iterator[tuple[AllocatedDevice, Attached | None, Device | None]]:
    """Each of ``allocated`` with the resource whose pool it names and the device it names there
    (None where this host publishes no such pool, or the pool no such device)."""
    by_pool = {a.pool: a for a in resources.values()}
    named: dict[str, dict[str, Device]] = {}  # pool -> DRA device name -> device, built once a pool
    for device in allocated:
        attached = by_pool.get(device.pool)
        if attached is None:
            yield device, None, None
            continue
        if device.pool not in named:
            named[device.pool] = {names.device_name(d.id): d for d in attached.server.table.devices}
        yield device, attached, named[device.pool].get(device.device)


def by_request(found: Iterable[Found]) -> dict[tuple[str, str], list[Found]]:
    """``found`` by (resource, request): what one hook call is about."""
    groups: dict[tuple[str, str], list[Found]] = {}
    for device in found:
        groups.setdefault((device.attached.server.name, device.allocated.request), []).append(device)
    return groups


class Request(NamedTuple):
    """One allocate call of a claim: a resource, its devices of one request, what the hook gets,
    the request's opaque parameters as the claim has them (None: none; kept in the checkpoint
    to hand the restore hook after a restart) and its devices as the checkpoint keeps them
    (without CDI IDs: those come from the hook's answer)."""

    resource: str
    attached: Attached
    found: Sequence[Found]
    asked: ClaimRequest
    parameters: object
    planned: tuple[PreparedDevice, ...]


def requests_of(
    claim: ClaimAllocation,
    driver: str,
    resources: Mapping[str, Attached],
    tainted: bool,
) -> list[Request]:
    """The allocate calls that prepare ``claim``'s devices of ``driver``: each device found and
    checked (:func:`pick`), each request's configuration checked by the backend's model, before
    anything is allocated.

    :raises ClaimRefused: a device is not served or unhealthy, or a configuration refused.
    """
    picked = pick(claim.devices_of(driver), resources, tainted)
    return [
        Request(
            resource,
            resources[resource],
            found,
            claim_request(claim, driver, request, found),
            None if (config := claim.config(driver, request)) is None else config.parameters,
            tuple(planned(request, resource, found)),
        )
        for (resource, request), found in picked.items()
    ]


def planned(request: str, resource: str, found: Sequence[Found]) -> Iterator[PreparedDevice]:
    """The request's devices as the checkpoint keeps them, before the hook gave their CDI IDs."""
    for f in found:
        allocated = f.allocated
        consumed = dict(allocated.consumed) if allocated.share_id else {}
        yield PreparedDevice(
            request,
            f.attached.pool,
            allocated.device,
            resource,
            f.device.id,
            (),
            allocated.admin_access,
            allocated.share_id,
            consumed,
        )


def pick(
    allocated: Sequence[AllocatedDevice],
    resources: Mapping[str, Attached],
    tainted: bool = False,
) -> dict[tuple[str, str], list[Found]]:
    """The allocated devices by (resource, request), each found and checked; an unhealthy one only
    where it is ``tainted`` (published with a taint the claim must have tolerated)."""
    picked: dict[tuple[str, str], list[Found]] = {}
    for device, attached, found in located(allocated, resources):
        if attached is None:
            raise ClaimRefused(f"pool {device.pool!r} is not served by this host")
        if found is None:
            raise ClaimRefused(f"device {device.device!r} is not in pool {device.pool!r}")
        if found.health is not Health.HEALTHY and not tainted:  # asked again: it may recover
            raise ClaimRefused(f"device {device.device!r} of pool {device.pool!r} is unhealthy")
        resource = attached.server.name
        same = picked.setdefault((resource, device.request), [])
        if any(p.allocated.device == device.device for p in same):
            raise ClaimRefused(f"device {device.device!r} is allocated twice to request {device.request!r}")
        same.append(Found(device, attached, found))
    return picked


def claim_request(claim: ClaimAllocation, driver: str, request: str, found: Sequence[Found]) -> ClaimRequest:
    """What a hook gets for ``found``, the claim's devices of one resource and ``request``: the
    request's configuration for ``driver`` checked by the backend's model, admin access, shares.

    :raises ClaimRefused: the backend's model refused the configuration, naming the request.
    """
    backend = found[0].attached.server.backend
    config = claim.config(driver, request)
    try:
        checked = None if config is None else backend.claim_config(config.parameters, "parameters")
    except HookError as exc:
        raise ClaimRefused(f"request {request!r}: {exc}") from None
    return ClaimRequest(
        request,
        f"{claim.namespace}/{claim.name}",
        claim.uid,
        checked,
        any(f.allocated.admin_access for f in found),
        {f.device.id: share for f in found if (share := f.share) is not None},
    )


def hold(server: ResourceServer, ids: Collection[str], holding: bool) -> None:
    """Prepared claims hold ``ids`` through DRA in the resource's inventory (or no longer do):
    the device plugin side masks them and what they would overdraw."""
    server.table.hold(HOLDER, DRA, ids, holding)


@contextlib.contextmanager
def reserved(requests: Sequence[Request], uid: str) -> Iterator[None]:
    """Hold the devices of ``requests`` of the claim ``uid`` through DRA while it is prepared (the
    device plugin side cannot give them out meanwhile), and with the prepared claims (:func:`hold`)
    once the block ends without an error; refused, naming why, when the device plugin side holds
    one or they would overdraw a counter set with what both APIs hold."""
    servers = {request.resource: request.attached.server for request in requests}
    ids: dict[str, list[str]] = {}
    for request in requests:
        ids.setdefault(request.resource, []).extend(f.device.id for f in request.found)
    for resource, wanted in ids.items():
        problem = servers[resource].table.view().refusal(DRA, wanted)
        if problem:
            raise ClaimRefused(f"{resource}: {problem}")
    holder = f"claim {uid}"
    for resource, wanted in ids.items():
        servers[resource].table.hold(holder, DRA, wanted)
    try:
        yield
        for resource, wanted in ids.items():
            hold(servers[resource], wanted, True)
    finally:
        for resource, wanted in ids.items():
            servers[resource].table.hold(holder, DRA, wanted, False)
