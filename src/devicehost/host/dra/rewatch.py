"""Following an API server watch for ever: the one loop that starts it again with backoff.

The ResourceSlice deletions the publisher follows and the ResourceClaims the binding and
allocation watches follow all go through :func:`rewatch`: a watch that breaks, or ends sooner than
:data:`WATCH_MIN_LIFE`, is started again after the project's :class:`Backoff` delay, never in a
spin; the failure is said once per kind of problem (:func:`problem_kind`), the recovery once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, TypeVar

import structlog

from devicehost.host.dra.cluster import ClusterError
from devicehost.host.serving.registration import Backoff

WATCH_MIN_LIFE = 1.0
"""A watch that ends sooner than this counts as failing (retried with backoff)."""

Event = TypeVar("Event")


async def rewatch(
    watch: Callable[[], AsyncIterator[Event]],
    seen: Callable[[Event], None],
    what: str,
    backoff: Backoff,
    log: structlog.typing.FilteringBoundLogger,
    restarted: Callable[[], None] | None = None,
) -> NoReturn:
    """Hand every event of ``watch()`` to ``seen``, for ever; ``restarted`` is called after every
    end of the watch (it may have missed events). ``what`` names the watch in the log lines:
    ``watching <what> failed, retrying with backoff`` and ``watching <what> again``."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            async for event in watch():
                if backoff.reset():
                    log.info(f"watching {what} again")
                seen(event)
            problem = "the watch ended" if loop.time() - started < WATCH_MIN_LIFE else None
        except ClusterError as exc:
            problem = str(exc)
        if problem is None:
            backoff.reset()
        else:
            delay, changed = backoff.fail(problem_kind(problem))
            if changed:
                log.warning(
                    f"watching {what} failed, retrying with backoff", error=problem, retry_in=round(delay, 2)
                )
            await asyncio.sleep(delay)
        if restarted is not None:
            restarted()


def problem_kind(problem: str) -> str:
    """What a failure is, without the numbers that change from one try to the next (a
    resourceVersion in "Too large resource version: 682, current: 681"): said once, not per try."""
    return re.sub(r"\d+", "N", problem)
