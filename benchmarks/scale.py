"""3. Scale: one process serving 1 to 300 resources of 16 devices, each with an open ListAndWatch.

For the host (``devicehost run``, example backend) and the bare baseline: time from process start
to every resource registered and streaming, RSS and threads (from /proc), and the Allocate p99 to
a random resource while all streams are open.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from benchmarks.figures import Figure, Target, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_some
from benchmarks.procs import launch, running
from benchmarks.settings import Settings

MEASUREMENT = "scale"
DEVICES = 16
TARGET_COUNT = 100
WARMUP = 20
REGISTER_TIMEOUT = 15.0
"""Seconds a server gets to register everything; one that misses it is reported with what it had."""
RSS_TARGETS = {100: Target("<", 150), 300: Target("<=", 80)}
"""MB of resident memory, by resource count (issue 17: 80 MB at 300 resources)."""
THREADS_PER_BACKEND = 8
"""The host's per-backend hook pool: the most threads resources may add over the 1-resource figure."""


async def one(kind: str, count: int, settings: Settings, workdir: Path) -> dict[str, float]:
    """Start a server with ``count`` resources; its figures."""
    directory = workdir / f"scale-{kind}-{count}"
    names = [f"{kind}.example.com/s{i}" for i in range(count)]
    rng = random.Random(count)
    async with (
        TimedKubelet(directory) as kubelet,
        running(
            await launch(kind, directory, dict.fromkeys(names, DEVICES), directory.with_suffix(".log"))
        ) as server,
    ):
        done, live = await wait_some(kubelet, names, REGISTER_TIMEOUT)
        registered = (time.monotonic() if done is None else done) - server.started
        samples = []
        for n in range(WARMUP + settings.scale_allocations):
            name = rng.choice(live)
            started = time.perf_counter()
            await kubelet.allocate_ids(name, [f"s{names.index(name)}-{rng.randrange(DEVICES)}"])
            if n >= WARMUP:
                samples.append(time.perf_counter() - started)
        rss, threads = server.usage()
    return {
        "registered": ms(registered),
        "live": len(live),
        "rss": round(rss, 1),
        "threads": threads,
        "p99": ms(percentile(samples, 99)),
    }


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    runs = {
        (kind, count): await one(kind, count, settings, workdir)
        for count in settings.scale_counts
        for kind in ("host", "bare")
    }
    first = settings.scale_counts[0]
    figures: list[Figure] = []
    for count in settings.scale_counts:
        host, bare = runs["host", count], runs["bare", count]
        at_target = count == TARGET_COUNT
        figures += [
            Figure(
                MEASUREMENT,
                f"{count} resources: registered",
                host["live"],
                "",
                bare["live"],
                Target(">=", count),
            ),
            Figure(
                MEASUREMENT,
                f"{count} resources: start to all registered",
                host["registered"],
                "ms",
                bare["registered"],
                Target("<=", 2000) if at_target else None,
            ),
            Figure(
                MEASUREMENT,
                f"{count} resources: RSS",
                host["rss"],
                "MB",
                bare["rss"],
                RSS_TARGETS.get(count),
            ),
            Figure(MEASUREMENT, f"{count} resources: threads", host["threads"], "", bare["threads"]),
            Figure(MEASUREMENT, f"{count} resources: Allocate p99", host["p99"], "ms", bare["p99"]),
        ]
        if count != first:
            figures += [
                Figure(
                    MEASUREMENT,
                    f"{count} resources: threads over {first} resource(s)",
                    host["threads"] - runs["host", first]["threads"],
                    "",
                    bare["threads"] - runs["bare", first]["threads"],
                    Target("<=", THREADS_PER_BACKEND),
                ),
                Figure(
                    MEASUREMENT,
                    f"{count} resources: Allocate p99 / {first}-resource p99",
                    round(host["p99"] / runs["host", first]["p99"], 3),
                    "x",
                    round(bare["p99"] / runs["bare", first]["p99"], 3),
                    Target("<=", 2.0) if at_target else None,
                ),
            ]
    return figures
