"""The stand-in's event log and its change signal: what tests read and wait on.

Every change to what the kubelet knows is recorded as an :class:`~devicehost.standin.model.Event`
or, for a repeated device list, only signalled. Waits re-check their condition at each signal,
so they need no polling and no sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from devicehost.standin.model import Event, EventKind

RECENT = 5
COMPONENT = "simulated-kubelet"
"""What every stand-in log line says it comes from, so it is never taken for the host's."""
"""How many of a resource's latest events a failed wait quotes."""


class EventLog:
    """Events, oldest first, and one signal that fires at every change."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._changed = asyncio.Event()
        self._log = structlog.get_logger("devicehost.kubelet").bind(component=COMPONENT)
        self.backend_of: Callable[[str], str | None] = lambda resource: None
        """Names the backend behind a resource, for the log (the simulated kubelet cannot know)."""

    def __len__(self) -> int:
        return len(self._events)

    def since(self, start: int = 0) -> list[Event]:
        """The events at index ``start`` and later, oldest first (a copy)."""
        return self._events[start:]

    def recent(self, resource: str) -> list[Event]:
        """The last few events of ``resource``."""
        return [e for e in self._events if e.resource == resource][-RECENT:]

    def emit(self, kind: EventKind, resource: str, detail: str) -> None:
        """Record an event, log it, and wake every wait."""
        self._events.append(Event(time.monotonic(), kind, resource, detail))
        backend = self.backend_of(resource)
        labels = {"backend": backend} if backend else {}
        self._log.info(str(kind), resource=resource, **labels, detail=detail)
        self.changed()

    def changed(self) -> None:
        """Wake every wait without recording an event (a change no event describes)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` is true, checking it again at every change; no timeout."""
        while True:
            changed = self._changed
            if done():
                return
            await changed.wait()

    async def wait_for(
        self,
        kind: EventKind | str | None,
        resource: str | None,
        since: int | None,
        timeout: float,  # noqa: ASYNC109
    ) -> Event:
        """The first matching event at index ``since`` or later (default: from now).

        Raises ``AssertionError`` naming what was seen when none comes within ``timeout``.
        """
        start = len(self._events) if since is None else since

        def match() -> Event | None:
            for event in self._events[start:]:
                if (kind is None or event.kind == kind) and (resource is None or event.resource == resource):
                    return event
            return None

        try:
            async with asyncio.timeout(timeout):
                await self.wait_until(lambda: match() is not None)
        except TimeoutError:
            pass
        found = match()
        if found is not None:
            return found
        raise AssertionError(
            f"no {kind or 'event'} for {resource or 'any resource'} within {timeout}s; "
            f"saw {self._events[start:]}"
        )
