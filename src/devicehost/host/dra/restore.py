"""What a driver's start does with its claims checkpoint, before the kubelet can call it.

A start follows a host restart, a crash in the middle of a call, or a node reboot (which also
emptied ``/var/run/cdi``, a tmpfs, and lost the hardware's state). The kubelet may still count
every claim of the checkpoint as prepared and start containers with their CDI IDs without asking
again. So, before the driver registers:

1. :func:`open_claims` reads the checkpoint (one that cannot be read is set aside, and the host
   starts without it) and writes the CDI spec of every prepared claim again where it is missing
   or differs: no backend is needed for that.
2. :func:`restore_resource`, as each resource of the driver is attached (the first before the
   registration socket is served), replays what a kill cut short and tells the backend: a claim
   still ``preparing`` is undone (released, its spec removed: the kubelet's retry prepares it
   afresh), a claim ``unpreparing`` or ``released`` is unprepared to the end, and for a ``prepared`` one the
   backend's ``devicehost_restore`` hook is called; a refusal unprepares that claim alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from devicehost.hookspecs.types import ClaimRequest, Share
from devicehost.host.backends.backend import HookError
from devicehost.host.dra.allocated import ClaimRefused
from devicehost.host.dra.checkpoint import Phase, PreparedClaim, PreparedDevice
from devicehost.host.dra.claims import Claims, ClaimSteps, owned


def open_claims(claims: Claims) -> None:
    """Read the checkpoint and write the CDI specs of its prepared claims again; said in one line."""
    checkpoint = claims.checkpoint
    problem = checkpoint.load()
    if problem:
        claims.log.error(
            "prepared claims checkpoint unreadable, set aside: starting without it", problem=problem
        )
    written, failed = 0, 0
    for claim in checkpoint.claims.values():
        if claim.phase is not Phase.PREPARED:
            continue
        try:
            written += claims.specs.ensure(claim)
        except (OSError, ValueError) as exc:
            failed += 1
            claims.log.error("CDI spec of a prepared claim not written again", uid=claim.uid, error=str(exc))
    if checkpoint.claims:
        cut_short = sum(c.phase is not Phase.PREPARED for c in checkpoint.claims.values())
        claims.log.info(
            "prepared claims restored",
            claims=len(checkpoint.claims),
            specs_written=written,
            specs_failed=failed,
            cut_short=cut_short,
        )


async def restore_resource(claims: Claims, resource: str) -> None:
    """Replay and restore the claims whose resources are all attached now that ``resource`` is,
    holding the claims' lock (no kubelet call is served meanwhile)."""
    if resource in claims.restored_resources:
        return  # attached again (rediscovered): its claims were restored at its first attach
    claims.restored_resources.add(resource)
    async with owned(claims.lock, claims.checkpoint, claims.resources):
        for claim in list(claims.checkpoint.claims.values()):
            needs = {d.resource for d in claim.devices}
            if claim.uid in claims.restored or resource not in needs or not needs <= claims.resources.keys():
                continue
            claims.restored.add(claim.uid)
            await _restore(claims, claim)


async def _restore(claims: Claims, claim: PreparedClaim) -> None:
    named = {"claim": f"{claim.namespace}/{claim.name}", "uid": claim.uid}
    try:
        if claim.phase is Phase.PREPARING:
            await claims.undo(claim, "its prepare was cut short")
            claims.log.warning("claim whose prepare was cut short undone", **named)
        elif claim.phase in (Phase.UNPREPARING, Phase.RELEASED):
            await claims.undo(claim, "its unprepare was cut short")
            claims.log.warning("claim whose unprepare was cut short unprepared", **named)
        else:
            await tell_backend(claims, claim)
    except ClaimRefused as exc:
        claims.log.error("claim not restored", **named, error=str(exc))
        claims.not_restored[claim.uid] = str(exc)


async def tell_backend(claims: ClaimSteps, claim: PreparedClaim) -> None:
    """The restore hook for each of the claim's resources and requests; a refusal unprepares it."""
    for resource, request, devices in by_request(claim):
        backend = claims.resources[resource].server.backend
        try:
            asked = restored_request(claims, claim, request, devices)
            await backend.restore(resource, tuple(d.device_id for d in devices), asked)
        except HookError as exc:
            reason = f"{resource}: {exc}"
            await claims.undo(claim, "the backend refused to restore it")
            raise ClaimRefused(reason) from None


def restored_request(
    claims: ClaimSteps, claim: PreparedClaim, request: str, devices: list[PreparedDevice]
) -> ClaimRequest:
    """The claim request the allocate hook got, built again from the checkpoint (the configuration
    checked by the backend's model again)."""
    parameters = claim.configs.get(request)
    backend = claims.resources[devices[0].resource].server.backend
    config = None if parameters is None else backend.claim_config(parameters, "parameters")
    shares = {d.device_id: Share(d.share, d.consumed) for d in devices if d.share}
    admin = any(d.admin_access for d in devices)
    return ClaimRequest(request, f"{claim.namespace}/{claim.name}", claim.uid, config, admin, shares)


def by_request(claim: PreparedClaim) -> Iterator[tuple[str, str, list[PreparedDevice]]]:
    """(resource, request, its devices) of the claim, in order."""
    grouped: dict[tuple[str, str], list[PreparedDevice]] = {}
    for device in claim.devices:
        grouped.setdefault((device.resource, device.request), []).append(device)
    for (resource, request), devices in grouped.items():
        yield resource, request, devices
