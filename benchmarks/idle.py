"""7. Idle: 100 resources with health polling at the default interval, nobody allocating.

The host in its own process (``benchmarks.host_server --mode poll``: every resource's health hook
is polled every ``health_interval``, 5 s by default) against the bare servicer with the same
resources and no polling at all. The figure is CPU time (user + system, every thread, from
/proc) over the window as a percentage of one core, and threads, both after every resource is
registered and streaming.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.figures import Figure, Target, compared
from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import ServerProcess, launch, launch_host_server, running
from benchmarks.settings import Settings

MEASUREMENT = "idle"
RESOURCES = 100
DEVICES = 16
HEALTH_INTERVAL = 5.0
"""The config's default ``health_interval``."""
TARGET = Target("<", 0.5)


async def _idle_cpu(server: ServerProcess, seconds: float) -> float:
    """Percent of one core the server used over ``seconds`` of idling."""
    before = server.cpu_seconds()
    await asyncio.sleep(seconds)
    return round(100 * (server.cpu_seconds() - before) / seconds, 3)


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / MEASUREMENT
    host_names = [f"host.example.com/i{n}" for n in range(RESOURCES)]
    bare_names = [f"bare.example.com/i{n}" for n in range(RESOURCES)]
    async with (
        TimedKubelet(directory) as kubelet,
        running(
            await launch_host_server(
                directory,
                dict.fromkeys(host_names, DEVICES),
                "poll",
                HEALTH_INTERVAL,
                workdir / "idle-host.log",
            )
        ) as host,
        running(
            await launch("bare", directory, dict.fromkeys(bare_names, DEVICES), workdir / "idle-bare.log")
        ) as bare,
    ):
        await wait_all(kubelet, host_names + bare_names, timeout=60)
        host_cpu, bare_cpu = await asyncio.gather(
            _idle_cpu(host, settings.idle_seconds), _idle_cpu(bare, settings.idle_seconds)
        )
        (_, host_threads), (_, bare_threads) = host.usage(), bare.usage()
    return [
        *compared(
            MEASUREMENT,
            f"{RESOURCES} resources polled every {HEALTH_INTERVAL:g} s, CPU over {settings.idle_seconds:g} s",
            host_cpu,
            bare_cpu,
            "% core",
            target=TARGET,
        )[:1],
        Figure(MEASUREMENT, f"{RESOURCES} resources: threads", host_threads, "", baseline=bare_threads),
    ]
