"""Claims awaiting binding conditions on this driver's devices, followed until they are True.

With ``DRADeviceBindingConditions`` the scheduler allocates a device that has binding conditions,
then waits (its binding timeout, 10 minutes by default) for each of them to be True in the claim's
``status.devices`` before it binds the pod; a binding failure condition that turns True makes it
give the device up. :class:`BindingWatch` sees every ResourceClaim; for each claim allocated
one of this driver's devices whose conditions are awaited it asks the backend
(``devicehost_device_status``, ``prepared=False``) and writes the answer, again every
:data:`POLL` seconds until they are all True, a failure condition is, or the claim is gone. It
follows the driver's one watch of every claim (:class:`~.claimwatch.ClaimWatch`), which it wants
once a device has binding conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from devicehost.host.backends.backend import HookError
from devicehost.host.dra.allocated import ClaimRefused
from devicehost.host.dra.claim_status import HOOK, after_prepare, awaiting, our_devices, reread, write_status
from devicehost.host.dra.cluster import ClaimAllocation, ClusterError

if TYPE_CHECKING:
    from devicehost.host.dra.allocated import Attached
    from devicehost.host.dra.checkpoint import PreparedClaim
    from devicehost.host.dra.cluster import Cluster

POLL = 1.0
"""Seconds between two questions to the backend about a claim whose conditions are awaited."""

Key = tuple[str, str]


class BindingWatch:
    """One driver's claims awaiting binding conditions, each followed by a task of its own."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        resources: Mapping[str, Attached],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._driver = driver
        self._cluster = cluster
        self._resources = resources
        self.log = log
        self.following: dict[Key, asyncio.Task[None]] = {}
        """The claims awaited now, by (namespace, name)."""
        self.settled = 0
        """Claims followed until they awaited nothing more (conditions True, failed, or gone)."""

    def wanted(self) -> bool:
        """Whether a resource of the driver has a device with binding conditions (and a backend
        with the hook, which discovery requires of it)."""
        return any(
            d.binding_conditions
            for a in self._resources.values()
            if a.server.backend.implements(HOOK)
            for d in a.server.table.devices
        )

    async def stop(self) -> None:
        """Stop following every claim."""
        tasks = list(self.following.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def restarted(self) -> None:
        """Nothing to do: a claim followed reads itself again, and one gone meanwhile settles."""

    async def after_prepare(
        self, answers: Mapping[str, PreparedClaim | str], reads: Mapping[str, ClaimAllocation | BaseException]
    ) -> None:
        """Write the device status of the claims just prepared (see :func:`.claim_status.after_prepare`)."""
        await after_prepare(self._cluster, self._driver, self._resources, answers, reads, self.log)

    def seen(self, event: tuple[str, ClaimAllocation]) -> None:
        """Follow a claim that awaits conditions on this driver's devices; let a deleted one go."""
        kind, claim = event
        key = (claim.namespace, claim.name)
        if kind == "DELETED":
            task = self.following.pop(key, None)
            if task is not None:
                task.cancel()
                self._settle(key, why="deleted")
            return
        if key in self.following:
            return
        if awaiting(claim, our_devices(claim, self._driver, self._resources)):
            self.following[key] = asyncio.create_task(self._follow(claim), name=f"binding {key[0]}/{key[1]}")

    async def _follow(self, seen: ClaimAllocation) -> None:
        """Ask and write until nothing of the claim is awaited (the claim read anew each time
        after the first); failures said once per claim. A claim whose configuration the backend
        refuses is not followed: its prepare fails too."""
        namespace, uid, name = seen.namespace, seen.uid, seen.name
        claim: ClaimAllocation | None = seen
        said = False
        try:
            while True:
                try:
                    if claim is None or not await write_status(
                        self._cluster, self._driver, self._resources, claim, prepared=False
                    ):
                        self._settle((namespace, name), uid=uid)
                        return
                except ClaimRefused as exc:
                    self.log.error(
                        "binding conditions not written", claim=f"{namespace}/{name}", error=str(exc)
                    )
                    return
                except (ClusterError, HookError) as exc:
                    if not said:
                        self.log.warning(
                            "binding conditions not written; asking again every second",
                            claim=f"{namespace}/{name}",
                            error=str(exc),
                        )
                        said = True
                await asyncio.sleep(POLL)
                claim = await self._fresh(seen)
        finally:
            with contextlib.suppress(KeyError):
                if self.following[(namespace, name)] is asyncio.current_task():
                    del self.following[(namespace, name)]

    def _settle(self, key: Key, **said: str) -> None:
        """Count a claim followed until it awaits nothing more, and say so (with ``said``)."""
        self.settled += 1
        self.log.info("claim no longer awaits binding conditions", claim=f"{key[0]}/{key[1]}", **said)

    async def _fresh(self, claim: ClaimAllocation) -> ClaimAllocation | None:
        """``claim`` read anew (None: gone); one that cannot be read now is asked about as it was."""
        try:
            return await reread(self._cluster, claim)
        except ClusterError:
            return claim
