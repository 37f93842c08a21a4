"""Helpers of the reliability suite: counters, process gauges, raw protobuf bytes, waits."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Ledger:
    """Counters (``restarts survived``...) and start/end measurements for RELIABILITY.md."""

    counts: dict[str, int] = field(default_factory=dict)
    notes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def note(self, name: str, start: object, end: object) -> None:
        self.notes[name] = (str(start), str(end))


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    """Resident set size of this process in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


async def wait_until(condition: Callable[[], bool], timeout: float = 10, what: str = "condition") -> None:  # noqa: ASYNC109
    """Poll ``condition`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(0.01)


# -- raw protobuf wire encoding, so string fields can carry bytes that are not UTF-8 ---------


def varint(value: int) -> bytes:
    """Protobuf base-128 varint (negative numbers as 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    """A varint field (wire type 0)."""
    return varint(number << 3) + varint(value)


def repeated(number: int, items: Iterable[bytes]) -> bytes:
    return b"".join(field_bytes(number, item) for item in items)


def allocate_request(containers: Iterable[Iterable[bytes]]) -> bytes:
    """AllocateRequest: container_requests = 1 { devices_ids = 1 }."""
    return repeated(1, (repeated(1, ids) for ids in containers))


def prestart_request(ids: Iterable[bytes]) -> bytes:
    """PreStartContainerRequest: devices_ids = 1."""
    return repeated(1, ids)


def preferred_request(containers: Iterable[tuple[Iterable[bytes], Iterable[bytes], int]]) -> bytes:
    """PreferredAllocationRequest: container_requests = 1 { available = 1, must_include = 2, size = 3 }."""
    return repeated(
        1,
        (
            repeated(1, available) + repeated(2, must) + field_varint(3, size)
            for available, must, size in containers
        ),
    )
