"""The one loop that follows an API server watch for ever (``host/dra/rewatch.py``): a watch
that ends at once or breaks is started again after a backoff delay, never in a spin, its
failure said once per kind of problem and its recovery once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import structlog
from waiting import eventually

from devicehost.host.dra.cluster import ClusterError
from devicehost.host.dra.rewatch import problem_kind, rewatch
from devicehost.host.serving.registration import Backoff

INITIAL = 0.02
"""The first backoff delay: a retry comes no sooner than half of it (the jitter)."""


def test_a_problem_s_kind_leaves_out_its_numbers() -> None:
    assert problem_kind("Too large resource version: 682, current: 681") == problem_kind(
        "Too large resource version: 690, current: 689"
    )
    assert problem_kind("the watch ended") != problem_kind("connection refused")


async def test_a_watch_that_ends_at_once_or_breaks_is_retried_with_backoff_and_said_once() -> None:
    loop = asyncio.get_running_loop()
    started: list[float] = []

    async def watch() -> AsyncIterator[str]:
        started.append(loop.time())
        tries = len(started)
        if tries <= 3:
            return  # ends at once: as failing as an error
        if tries == 4:
            yield "first"
            raise ClusterError("Too large resource version: 682, current: 681")
        if tries == 5:
            raise ClusterError("Too large resource version: 683, current: 682")  # the same kind
        yield "second"
        await asyncio.Event().wait()

    seen: list[str] = []
    restarts: list[None] = []
    backoff = Backoff(INITIAL, 0.1)
    with structlog.testing.capture_logs() as logs:
        following = asyncio.create_task(
            rewatch(
                watch, seen.append, "things", backoff, structlog.get_logger(), lambda: restarts.append(None)
            )
        )
        await eventually(lambda: seen == ["first", "second"], "both events handed on", within=10)
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    said = [(e["event"], e.get("error")) for e in logs]
    assert said == [
        ("watching things failed, retrying with backoff", "the watch ended"),
        ("watching things again", None),
        ("watching things failed, retrying with backoff", "Too large resource version: 682, current: 681"),
        ("watching things again", None),
    ]
    assert (len(started), len(restarts)) == (6, 5)  # every end of the watch told
    gaps = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert min(gaps) >= INITIAL / 2  # never started again in a spin
    assert backoff.failures == 0  # the watch works again: the next failure waits the shortest delay
