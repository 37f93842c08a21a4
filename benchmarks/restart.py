"""4. Kubelet restart: from ``kubelet.sock`` recreated to every resource registered and streaming again.

The stand-in restarts as the kubelet does (connections closed, the dir cleaned, a new socket); the
bare baseline follows ``kubelet.sock`` with inotify and registers again at once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_some
from benchmarks.procs import launch, running
from benchmarks.settings import Settings

MEASUREMENT = "restart"
DEVICES = 16
TARGETS: dict[tuple[int, str], Target] = {
    (1, "p99"): Target("<", 50),
    (1, "max"): Target("<", 200),
    (3, "p99"): Target("<", 50),
    (3, "max"): Target("<", 200),
    (100, "p50"): Target("<=", 150),
    (100, "p99"): Target("<=", 500),
}
"""Issue 17's: 1-3 resources p99 < 50 ms and max < 200 ms over 1,000 restarts; 100 resources p50."""
REGISTER_TIMEOUT = 15.0
BACK_TIMEOUT = 10.0
"""Seconds every resource gets to come back; the first restart that misses it ends the series."""
SETTLE = 0.05
"""Seconds between two restarts (time for the last stream's first answer to settle)."""


async def one(kind: str, count: int, restarts: int, workdir: Path) -> tuple[list[float], int]:
    """Seconds back after each restart, and how many resources had registered before the first
    (a server that had not registered them all is timed on those it had)."""
    directory = workdir / f"restart-{kind}-{count}"
    names = [f"{kind}.example.com/k{i}" for i in range(count)]
    samples = []
    async with (
        TimedKubelet(directory) as kubelet,
        running(await launch(kind, directory, dict.fromkeys(names, DEVICES), directory.with_suffix(".log"))),
    ):
        _, live = await wait_some(kubelet, names, REGISTER_TIMEOUT)
        for _ in range(restarts):
            await asyncio.sleep(SETTLE)
            await kubelet.restart()
            recreated = time.monotonic()
            back, _ = await wait_some(kubelet, live, BACK_TIMEOUT)
            if back is None:  # not every resource came back: a failure, not a timing
                break
            samples.append(back - recreated)
    return samples, len(live)


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    figures: list[Figure] = []
    for count, restarts in settings.restart_counts:
        host, host_live = await one("host", count, restarts, workdir)
        bare, bare_live = await one("bare", count, restarts, workdir)
        figures += [
            Figure(
                MEASUREMENT,
                f"{count} resources registered before restarts",
                host_live,
                "",
                bare_live,
                Target(">=", count),
            ),
            Figure(
                MEASUREMENT,
                f"{count} resources: restarts with every resource back",
                len(host),
                "",
                len(bare),
                Target(">=", restarts),
            ),
        ]
        host, bare = host or [BACK_TIMEOUT], bare or [BACK_TIMEOUT]
        for stat, pick in (("p50", 50), ("p99", 99), ("max", 100)):
            figures += compared(
                MEASUREMENT,
                f"{count} resources back {stat}",
                ms(percentile(host, pick)),
                ms(percentile(bare, pick)),
                "ms",
                target=TARGETS.get((count, stat)),
            )
    return figures
