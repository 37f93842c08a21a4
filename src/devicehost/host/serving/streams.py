"""The ListAndWatch streams of one resource, and the registration epoch each belongs to.

A registrar starts a new epoch before each registration; a stream remembers the epoch it was
opened in. When a stream of the current epoch ends from the kubelet's side, the resource must
register again; the end of an older one (ended on purpose, or replaced) means nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from devicehost.host.serving.table import DeviceTable

END_WAIT = 1.0
"""Seconds :meth:`StreamSet.end_all` waits for the streams it ended to finish."""


class Stream:
    """One open ListAndWatch stream."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        """The registration epoch it was opened in."""
        self.ending = False
        """Set when the host ends it: the stream's loop returns at its next wake-up."""
        self.done = asyncio.Event()


class StreamSet:
    """Open streams of one resource; tells ``on_lost`` when the kubelet ends one."""

    def __init__(self, table: DeviceTable, on_lost: Callable[[int], None]) -> None:
        self._table = table
        self._on_lost = on_lost
        self._streams: set[Stream] = set()
        self.epoch = 0
        """The current registration epoch: streams opened from now on belong to it."""
        self.epoch_started: float | None = None
        """When the current epoch began (a registration went out), seconds since the epoch;
        None before the first. Compared with other hosts' socket files (their creation time)."""

    @property
    def count(self) -> int:
        return len(self._streams)

    def new_epoch(self) -> None:
        """Begin a new registration: streams of earlier ones no longer count as lost."""
        self.epoch += 1
        self.epoch_started = time.time()

    @contextlib.contextmanager
    def open(self) -> Iterator[Stream]:
        """Hold one stream for the life of a ListAndWatch call."""
        stream = Stream(self.epoch)
        self._streams.add(stream)
        try:
            yield stream
        finally:
            self._streams.discard(stream)
            stream.done.set()
            if not stream.ending:  # the registrar says so, once per change
                self._on_lost(stream.epoch)

    async def end_all(self) -> None:
        """End every open stream and wait (at most :data:`END_WAIT`) until each has ended."""
        streams = list(self._streams)
        for stream in streams:
            stream.ending = True
        self._table.wake_all()
        if streams:
            waits = [asyncio.ensure_future(s.done.wait()) for s in streams]
            _, pending = await asyncio.wait(waits, timeout=END_WAIT)
            for wait in pending:
                wait.cancel()
