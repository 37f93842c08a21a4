"""A claim's calls of the backend's allocate and release hooks.

Prepare allocates a claim's devices with one allocate call per resource and request, all of them
or none (:func:`allocated`: what the earlier calls gave is released again when a later one, or
what follows them, fails); unprepare and a failed prepare release the devices no other claim
holds, and every share (:func:`release_free`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence

import structlog

from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra.allocated import Attached, ClaimRefused, Request
from devicehost.host.dra.checkpoint import Checkpoint, PreparedDevice, by_resource


@contextlib.asynccontextmanager
async def allocated(
    requests: Sequence[Request],
    checkpoint: Checkpoint,
    resources: Mapping[str, Attached],
    log: structlog.typing.FilteringBoundLogger,
) -> AsyncIterator[list[ContainerAllocation]]:
    """What each allocate call answered, in the order of ``requests``. When a call fails, or the
    block raises :class:`ClaimRefused` (the claim's CDI spec could not be written), what was
    allocated is released again (failures logged) and the claim is refused."""
    given: list[ContainerAllocation] = []
    try:
        for request in requests:
            ids = tuple(f.device.id for f in request.found)
            try:
                given.append(
                    await request.attached.server.backend.allocate(request.resource, ids, request.asked)
                )
            except HookError as exc:
                raise ClaimRefused(str(exc)) from None
        yield given
    except ClaimRefused:
        whole = len(given) == len(requests)
        why = "its CDI spec could not be written" if whole else "a later allocation of the claim failed"
        devices = [d for request in requests[: len(given)] for d in request.planned]
        if devices:
            asked = requests[0].asked
            await release_free(checkpoint, resources, devices, why, (asked.claim, asked.uid), log)
        raise


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
