"""9. Soak: nothing gained over many kubelet restarts in a row (issue 17: 10,000 in full mode).

One resource; the stand-in restarts ``soak_restarts`` times, each as soon as the resource is
registered and streaming again after the one before. The host is the real one
(``benchmarks.host_server --mode poll``, health polled every 5 s); the bare servicer follows
``kubelet.sock`` with inotify. RSS, threads, open fds (``/proc/<pid>/fd``) and asyncio tasks (the
``tasks`` stdin command) are read after the warm-up (restart ``soak_restarts // 10``) and at the
end; the growth between the two is the figure. A restart not back within ``BACK_TIMEOUT`` ends the
series (the restart count then misses its target, and the warm-up read is the end's if the series
ended before the warm-up).
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.figures import Figure, Target, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_some
from benchmarks.procs import ServerProcess, launch, launch_host_server, running
from benchmarks.settings import Settings
from devicehost.standin import KubeletStandIn

MEASUREMENT = "soak"
DEVICES = 4
HEALTH_INTERVAL = 5.0
"""The config's default ``health_interval``."""
REGISTER_TIMEOUT = 15.0
BACK_TIMEOUT = 10.0
"""Seconds the resource gets to come back after a restart; the first miss ends the series."""
READS = 5
READ_GAP = 0.1
"""A read is the least of ``READS`` reads ``READ_GAP`` s apart: a task or fd of a moment does not count."""
RSS_TARGET = Target("<", 1)
FLAT = Target("<=", 0)


@dataclass(frozen=True)
class Usage:
    """What the server holds at one point: RSS in MB, threads, open fds, asyncio tasks."""

    rss: float
    threads: int
    fds: int
    tasks: int
    thread_names: tuple[str, ...] = ()
    """The kernel's name of each thread (grpc's own are named, Python's are ``python``)."""


@dataclass(frozen=True)
class Series:
    """Seconds back after each restart that came back, and the reads after warm-up and at the end."""

    backs: list[float]
    warm: Usage
    end: Usage


async def read_usage(server: ServerProcess) -> Usage:
    """The least of each count over ``READS`` reads."""
    reads = []
    for _ in range(READS):
        await asyncio.sleep(READ_GAP)
        rss, threads = server.usage()
        fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        tasks = int(await server.command("tasks"))
        reads.append((rss, threads, fds, tasks))
    rss, threads, fds, tasks = (min(column) for column in zip(*reads, strict=True))
    tasks_dir = Path(f"/proc/{server.proc.pid}/task")
    names = tuple(sorted((tasks_dir / tid / "comm").read_text().strip() for tid in os.listdir(tasks_dir)))
    return Usage(round(rss, 3), int(threads), int(fds), int(tasks), names)


def say_new_threads(kind: str, series: Series) -> None:
    """Name the threads that appeared after the warm-up (on stderr, beside the table)."""
    new = collections.Counter(series.end.thread_names) - collections.Counter(series.warm.thread_names)
    if new:
        print(f"   {kind}: threads new after the warm-up: {dict(new)}", file=sys.stderr, flush=True)


async def restarts(kubelet: KubeletStandIn, server: ServerProcess, name: str, settings: Settings) -> Series:
    """Restart the stand-in ``settings.soak_restarts`` times, each once the resource is back."""
    warmup = settings.soak_restarts // 10
    backs: list[float] = []
    warm = None
    for done in range(1, settings.soak_restarts + 1):
        await kubelet.restart()
        recreated = time.monotonic()
        back, _ = await wait_some(kubelet, [name], BACK_TIMEOUT)
        if back is None:  # not back: a failure, and the end of the series
            break
        backs.append(back - recreated)
        if done == warmup:
            warm = await read_usage(server)
    end = await read_usage(server)
    return Series(backs, warm or end, end)


async def launch_server(kind: str, directory: Path, name: str, log: Path) -> ServerProcess:
    """The real host (``benchmarks.host_server``, polling health) or the bare servicer."""
    if kind == "host":
        return await launch_host_server(directory, {name: DEVICES}, "poll", HEALTH_INTERVAL, log)
    return await launch(kind, directory, {name: DEVICES}, log)


async def one(kind: str, settings: Settings, workdir: Path) -> Series:
    directory = workdir / f"soak-{kind}"
    name = f"{kind}.example.com/soak"
    async with (
        TimedKubelet(directory) as kubelet,
        running(await launch_server(kind, directory, name, directory.with_suffix(".log"))) as server,
    ):
        registered, _ = await wait_some(kubelet, [name], REGISTER_TIMEOUT)
        if registered is None:
            usage = await read_usage(server)
            return Series([], usage, usage)
        return await restarts(kubelet, server, name, settings)


def figures(settings: Settings, host: Series, bare: Series) -> list[Figure]:
    warmup = settings.soak_restarts // 10
    result = [
        Figure(
            MEASUREMENT,
            "restarts with the resource back",
            len(host.backs),
            "",
            len(bare.backs),
            Target(">=", settings.soak_restarts),
        )
    ]
    host_backs, bare_backs = host.backs or [BACK_TIMEOUT], bare.backs or [BACK_TIMEOUT]
    for pct in (50, 99):
        result.append(
            Figure(
                MEASUREMENT,
                f"restart to back p{pct}",
                ms(percentile(host_backs, pct)),
                "ms",
                ms(percentile(bare_backs, pct)),
            )
        )
    result.append(Figure(MEASUREMENT, f"RSS at restart {warmup}", host.warm.rss, "MB", bare.warm.rss))
    result.append(Figure(MEASUREMENT, "RSS at end", host.end.rss, "MB", bare.end.rss))
    result += [growth("rss", "MB", RSS_TARGET, warmup, host, bare)]
    result += [growth(field, "", FLAT, warmup, host, bare) for field in ("threads", "fds", "tasks")]
    for field in ("threads", "fds", "tasks"):
        result.append(
            Figure(MEASUREMENT, f"{field} at end", getattr(host.end, field), "", getattr(bare.end, field))
        )
    return result


def growth(field: str, unit: str, target: Target, warmup: int, host: Series, bare: Series) -> Figure:
    """``field`` at the end less ``field`` after the warm-up, the host's against the bare's."""
    host_growth = getattr(host.end, field) - getattr(host.warm, field)
    bare_growth = getattr(bare.end, field) - getattr(bare.warm, field)
    label = "RSS" if field == "rss" else field
    return Figure(
        MEASUREMENT,
        f"{label} growth after restart {warmup}",
        round(host_growth, 3),
        unit,
        round(bare_growth, 3),
        target,
    )


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    host = await one("host", settings, workdir)
    bare = await one("bare", settings, workdir)
    say_new_threads("host", host)
    say_new_threads("bare", bare)
    return figures(settings, host, bare)
