"""EventLog: the stand-in's events and the change signal its waits park on."""

from __future__ import annotations

import asyncio
import re

import pytest

from devicehost.standin.events import RECENT, EventLog
from devicehost.standin.model import EventKind

A, B = "example.com/a", "example.com/b"


async def still_waiting(task: asyncio.Task[object]) -> bool:
    """Whether ``task`` is still parked after being given a short, bounded chance to finish."""
    _, pending = await asyncio.wait([task], timeout=0.05)
    return task in pending


def test_emit_records_in_order_with_rising_times() -> None:
    log = EventLog()
    log.emit(EventKind.REGISTERED, A, "endpoint a")
    log.emit(EventKind.DEVICES, B, "1 of 1 healthy")
    events = log.since(0)
    assert [e[1:] for e in events] == [
        (EventKind.REGISTERED, A, "endpoint a"),
        (EventKind.DEVICES, B, "1 of 1 healthy"),
    ]
    assert events[0].at <= events[1].at
    assert len(log) == 2
    assert log.since(1) == events[1:]
    log.since(0).clear()  # a copy: the log keeps its events
    assert len(log) == 2


def test_recent_quotes_only_the_last_events_of_one_resource() -> None:
    log = EventLog()
    for n in range(RECENT + 2):
        log.emit(EventKind.DEVICES, A, f"list {n}")
        log.emit(EventKind.DEVICES, B, f"other {n}")
    recent = log.recent(A)
    assert [e.detail for e in recent] == [f"list {n}" for n in range(2, RECENT + 2)]
    assert log.recent("example.com/none") == []


async def test_wait_for_finds_an_event_already_recorded_since_an_index() -> None:
    log = EventLog()
    log.emit(EventKind.REGISTERED, A, "first")
    log.emit(EventKind.REGISTERED, A, "second")
    assert (await log.wait_for(EventKind.REGISTERED, A, since=0, timeout=1)).detail == "first"
    assert (await log.wait_for(EventKind.REGISTERED, A, since=1, timeout=1)).detail == "second"
    assert (await log.wait_for(None, None, since=0, timeout=1)).detail == "first"


async def test_wait_for_skips_events_that_do_not_match_until_one_does() -> None:
    log = EventLog()
    waiter: asyncio.Task[object] = asyncio.create_task(
        log.wait_for("disconnected", A, since=len(log), timeout=5)
    )
    log.emit(EventKind.DISCONNECTED, B, "other resource")
    log.emit(EventKind.DEVICES, A, "other kind")
    assert await still_waiting(waiter)
    log.emit(EventKind.DISCONNECTED, A, "this one")
    found = await waiter
    assert isinstance(found, tuple)
    assert found[1:] == (EventKind.DISCONNECTED, A, "this one")


async def test_wait_for_from_now_ignores_older_events_and_says_what_it_saw() -> None:
    log = EventLog()
    log.emit(EventKind.REGISTERED, A, "before")
    with pytest.raises(
        AssertionError, match=re.escape("no registered for example.com/a within 0.05s; saw []")
    ):
        await log.wait_for(EventKind.REGISTERED, A, since=None, timeout=0.05)
    log.emit(EventKind.DEVICES, A, "0 of 1 healthy")
    with pytest.raises(
        AssertionError, match=r"no deregistered for any resource within 0\.05s; saw \[.*'0 of 1 healthy'"
    ):
        await log.wait_for(EventKind.DEREGISTERED, None, since=1, timeout=0.05)


async def test_a_change_without_an_event_wakes_a_waiting_condition() -> None:
    log = EventLog()
    state = {"ready": False, "checks": 0}
    checked = asyncio.Event()

    def ready() -> bool:
        state["checks"] += 1
        checked.set()
        return bool(state["ready"])

    waiter: asyncio.Task[object] = asyncio.create_task(log.wait_until(ready))
    await asyncio.wait_for(checked.wait(), 1)  # checked once, and parked on the signal since
    state["ready"] = True
    assert await still_waiting(waiter)  # nothing said it changed
    assert state["checks"] == 1
    log.changed()
    await asyncio.wait_for(waiter, 1)
    assert state["checks"] == 2
    assert len(log) == 0
