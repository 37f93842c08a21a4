"""Bounded waiting on state, for tests: never a bare sleep as synchronisation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

WITHIN = 10.0
"""Seconds a bounded wait allows by default: generous, the machine may be busy."""
SPIN = 0.05
"""Seconds of pure yielding before the wait starts sleeping between checks."""


async def eventually(predicate: Callable[[], bool], what: str = "", within: float = WITHIN) -> None:
    """Poll ``predicate`` (yielding to the loop) until it holds; fail after ``within`` seconds.

    It yields without sleeping at first (work driven by the loop alone finishes at once), then
    checks every 5 ms (work in other threads or processes gets the CPU).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not predicate():
        elapsed = loop.time() - started
        if elapsed > within:
            raise AssertionError(f"not true after {within} s: {what or predicate}")
        await asyncio.sleep(0 if elapsed < SPIN else 0.005)
