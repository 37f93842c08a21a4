"""Claims awaiting binding conditions on this driver's devices, followed until they hold.

With ``DRADeviceBindingConditions`` the scheduler allocates a device that has binding conditions,
then waits (its binding timeout, 10 minutes by default) for each of them to be True in the claim's
``status.devices`` before it binds the pod; a binding failure condition that turns True makes it
give the device up. :class:`BindingWatch` watches every ResourceClaim; for each claim allocated
one of this driver's devices whose conditions are awaited it asks the backend
(``devicehost_device_status``, ``prepared=False``) and writes the answer, again every
:data:`POLL` seconds until they all hold, a failure condition does, or the claim is gone. A
watch that breaks is started again with backoff, said once per kind of problem until it works again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from devicehost.host.backends.backend import HookError
from devicehost.host.dra.claim_status import HOOK, after_prepare, awaiting, our_devices, write_status
from devicehost.host.dra.cluster import ClusterError
from devicehost.host.dra.publisher import problem_kind
from devicehost.host.serving.registration import Backoff

if TYPE_CHECKING:
    from devicehost.host.dra.claims import Attached
    from devicehost.host.dra.cluster import Cluster

POLL = 1.0
"""Seconds between two questions to the backend about a claim whose conditions are awaited."""
BACKOFF = (1.0, 30.0)
"""Seconds before the watch is started again after its first failure in a row, and the most."""

Key = tuple[str, str]


class BindingWatch:
    """One driver's claims awaiting binding conditions, each followed by a task of its own."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        resources: Mapping[str, Attached],
        changed: Callable[[int], Awaitable[int]],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._driver = driver
        self._changed = changed
        self._cluster = cluster
        self._resources = resources
        self.log = log
        self.following: dict[Key, asyncio.Task[None]] = {}
        """The claims awaited now, by (namespace, name)."""
        self._watching: asyncio.Task[None] | None = None
        self.settled = 0
        """Claims followed until they awaited nothing more (conditions True, failed, or gone)."""

    def start(self) -> None:
        """Start :meth:`run` (once: later calls do nothing)."""
        if self._watching is None:
            self._watching = asyncio.create_task(self.run(), name=f"binding {self._driver}")

    def wanted(self) -> bool:
        """Whether a resource of the driver has a device with binding conditions (and a backend
        with the hook, which discovery requires of it)."""
        return any(
            d.binding_conditions
            for a in self._resources.values()
            if a.server.backend.implements(HOOK)
            for d in a.server.table.devices
        )

    async def run(self) -> None:
        """Once a device has binding conditions, watch the claims for ever, the watch started again
        with backoff when it breaks (no watch while none has: it would read every claim for nothing)."""
        seen = -1
        while not self.wanted():
            seen = await self._changed(seen)
        self.log.info("watching ResourceClaims: devices have binding conditions")
        backoff = Backoff(*BACKOFF)
        while True:
            try:
                async for kind, claim in self._cluster.claim_events():
                    if backoff.reset():
                        self.log.info("watching ResourceClaims for binding conditions again")
                    self._seen(kind, claim)
                raise ClusterError("the watch ended")
            except ClusterError as exc:
                wait, changed = backoff.fail(problem_kind(str(exc)))
                if changed:
                    self.log.warning(
                        "watching ResourceClaims for binding conditions failed; retrying with backoff",
                        error=str(exc),
                        retry_in=round(wait, 2),
                    )
                await asyncio.sleep(wait)

    async def stop(self) -> None:
        """Stop watching, and following every claim."""
        tasks = [*self.following.values(), *([self._watching] if self._watching else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def after_prepare(
        self, answers: Mapping[str, object], claims: Sequence[tuple[str, str, str]]
    ) -> None:
        """Write the device status of the claims just prepared (see :func:`.claim_status.after_prepare`)."""
        await after_prepare(self._cluster, self._driver, self._resources, answers, claims, self.log)

    def _seen(self, kind: str, claim: Mapping[str, Any]) -> None:
        meta = claim.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "DELETED":
            task = self.following.pop(key, None)
            if task is not None:
                task.cancel()
            return
        if key in self.following:
            return
        ours = [
            d
            for d in our_devices(claim, self._driver, self._resources)
            if d.attached.server.backend.implements(HOOK)
        ]
        if awaiting(claim, ours):
            ref = (key[0], str(meta.get("uid", "")), key[1])
            self.following[key] = asyncio.create_task(self._follow(ref), name=f"binding {key[0]}/{key[1]}")

    async def _follow(self, ref: tuple[str, str, str]) -> None:
        """Ask and write until nothing of the claim is awaited; failures said once per claim."""
        namespace, uid, name = ref
        said = False
        try:
            while True:
                try:
                    if not await write_status(
                        self._cluster, self._driver, self._resources, ref, prepared=False
                    ):
                        self.settled += 1
                        self.log.info(
                            "claim no longer awaits binding conditions", claim=f"{namespace}/{name}", uid=uid
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
        finally:
            with contextlib.suppress(KeyError):
                if self.following[(namespace, name)] is asyncio.current_task():
                    del self.following[(namespace, name)]
