"""2. Health propagation: from a backend's change to the ListAndWatch message in the client process.

Push: the backend calls the ResourceNotifier from its own thread; the bare baseline changes its
list from a thread the same way. Poll: the backend only answers ``devicehost_health``, so a change
waits for the next poll (bounded by the interval). Both ends stamp ``time.monotonic()``, which is
one clock for every process on Linux.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import ServerProcess, launch, launch_host_server, running
from benchmarks.settings import Settings

MEASUREMENT = "health"
PUSH_TARGET = Target("<=", 5.0)
PUSH_TARGET_SIZE = 128
POLL_SLACK = 0.05
"""Seconds a polled change may take beyond the interval (the hook call and the push)."""
GAP = (0.025, 0.04)
"""Seconds between two changes: above the host's 20 ms minimum between pushes on a stream."""
ARRIVAL_TIMEOUT = 10.0


async def latency(kubelet: TimedKubelet, server: ServerProcess, name: str, health: str) -> float:
    """Change device 0 of ``name`` to ``health``; seconds until the client has the message saying so."""
    queue = kubelet.watch(name)
    while not queue.empty():
        queue.get_nowait()
    changed = await server.command(f"push {name} {health}")
    async with asyncio.timeout(ARRIVAL_TIMEOUT):
        while True:
            arrived, message = await queue.get()
            if message.devices[0].health == health:
                return arrived - changed


def health_at(n: int) -> str:
    return "Unhealthy" if n % 2 == 0 else "Healthy"


async def push(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / "push"
    host_names = {size: f"host.example.com/d{size}" for size in settings.push_sizes}
    bare_names = {size: f"bare.example.com/d{size}" for size in settings.push_sizes}
    rng = random.Random(2)
    samples: dict[str, list[float]] = {name: [] for name in [*host_names.values(), *bare_names.values()]}
    async with (
        TimedKubelet(directory) as kubelet,
        running(
            await launch_host_server(
                directory, {host_names[s]: s for s in host_names}, "push", 5.0, workdir / "push-host.log"
            )
        ) as host,
        running(
            await launch("bare", directory, {bare_names[s]: s for s in bare_names}, workdir / "push-bare.log")
        ) as bare,
    ):
        await wait_all(kubelet, samples, timeout=30)
        for name in samples:
            kubelet.watch(name)
        for n in range(settings.push_samples):
            for size in settings.push_sizes:
                pairs = [(host, host_names[size]), (bare, bare_names[size])]
                for server, name in pairs if n % 2 else pairs[::-1]:
                    await asyncio.sleep(rng.uniform(*GAP))
                    samples[name].append(await latency(kubelet, server, name, health_at(n)))
    figures: list[Figure] = []
    for size in settings.push_sizes:
        for pct in (50, 99):
            host_ms, bare_ms = (
                ms(percentile(samples[names[size]], pct)) for names in (host_names, bare_names)
            )
            target = PUSH_TARGET if pct == 99 and size == PUSH_TARGET_SIZE else None
            figures += compared(
                MEASUREMENT, f"push {size} devices p{pct}", host_ms, bare_ms, "ms", target=target
            )
    return figures


async def poll(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / "poll"
    name = "host.example.com/p16"
    interval = settings.poll_interval
    rng = random.Random(3)
    samples = []
    async with (
        TimedKubelet(directory) as kubelet,
        running(
            await launch_host_server(directory, {name: 16}, "poll", interval, workdir / "poll-host.log")
        ) as host,
    ):
        await wait_all(kubelet, [name], timeout=30)
        for n in range(settings.poll_samples):
            await asyncio.sleep(rng.uniform(0, interval))
            samples.append(await latency(kubelet, host, name, health_at(n)))
    limit = Target("<=", ms(interval + POLL_SLACK))
    return [
        Figure(
            MEASUREMENT, f"poll every {interval:g} s, p50", ms(percentile(samples, 50)), "ms", ms(interval)
        ),
        Figure(MEASUREMENT, f"poll every {interval:g} s, max", ms(max(samples)), "ms", ms(interval), limit),
    ]


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    return [*await push(settings, workdir), *await poll(settings, workdir)]
