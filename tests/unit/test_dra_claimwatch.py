"""A driver's one watch of every ResourceClaim (``host/dra/claimwatch.py``): opened once a
follower wants it, every event to every follower, and each told when the watch started again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog
from structlog.testing import capture_logs
from waiting import eventually

from devicehost.host.dra.claimwatch import ClaimWatch
from devicehost.host.dra.cluster import ClaimAllocation, ClusterError
from devicehost.standin.apiserver import ApiServerStandIn

DRIVER = "example.com"


class Counting(ApiServerStandIn):
    """The in-memory API server, counting the claim watches opened; the first ``refusals`` fail."""

    def __init__(self, refusals: int = 0) -> None:
        super().__init__()
        self.watches = 0
        self.refusals = refusals

    async def claim_events(self) -> AsyncIterator[tuple[str, ClaimAllocation]]:
        self.watches += 1
        if self.watches <= self.refusals:
            raise ClusterError("watching ResourceClaims: 410 Gone")
        async for event in super().claim_events():
            yield event


class Follower:
    def __init__(self, wanted: bool) -> None:
        self.wanting = wanted
        self.events: list[tuple[str, str]] = []
        self.restarts = 0

    def wanted(self) -> bool:
        return self.wanting

    def seen(self, event: tuple[str, ClaimAllocation]) -> None:
        self.events.append((event[0], event[1].name))

    def restarted(self) -> None:
        self.restarts += 1


class Changes:
    def __init__(self) -> None:
        self.version = 0
        self.bumped = asyncio.Event()

    async def wait(self, seen: int) -> int:
        while self.version == seen:
            await self.bumped.wait()
            self.bumped.clear()
        return self.version

    def bump(self) -> None:
        self.version += 1
        self.bumped.set()


async def test_one_watch_for_every_follower_opened_once_one_wants_it() -> None:
    api = Counting()
    binding, allocations = Follower(False), Follower(False)
    changes = Changes()
    watch = ClaimWatch(
        api, {"binding conditions": binding, "allocations": allocations}, changes.wait, structlog.get_logger()
    )
    with capture_logs() as logs:
        watch.start()
        api.claims[("default", "a")] = ClaimAllocation("uid-a", ())
        await asyncio.sleep(0.2)
        assert api.watches == 0  # nobody wants it: no watch reads every claim for nothing
        allocations.wanting = True
        changes.bump()
        await eventually(lambda: ("ADDED", "a") in binding.events and ("ADDED", "a") in allocations.events)
        await watch.stop()
    assert api.watches == 1  # one watch, both followers
    (said,) = [e for e in logs if e["event"] == "watching ResourceClaims"]
    assert said["purposes"] == ["allocations"]


async def test_every_follower_is_told_when_the_watch_started_again() -> None:
    api = Counting(refusals=1)
    followers = {"one": Follower(True), "two": Follower(True)}
    watch = ClaimWatch(api, followers, Changes().wait, structlog.get_logger())
    with capture_logs() as logs:
        watch.start()
        await eventually(lambda: api.watches == 2, within=5)  # refused once, again after 1 s
        await watch.stop()
    assert [f.restarts for f in followers.values()] == [1, 1]
    assert [e["event"] for e in logs].count("watching ResourceClaims failed, retrying with backoff") == 1
