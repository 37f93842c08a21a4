"""1. Allocate round trip as the kubelet sees it: the host against the bare servicer, p50 and p99.

One kubelet stand-in (this process) talks to both server processes over their unix sockets and
alternates the calls, so both see the same machine state; each resource has 16 devices. Beside
the round trips it reports each server's CPU time per Allocate (user + system, all its threads):
unlike the round trip it hardly moves with the load other processes put on the machine.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import launch, running
from benchmarks.settings import Settings

MEASUREMENT = "allocate"
HOST = "host.example.com/r0"
BARE = "bare.example.com/r0"
DEVICES = 16
WARMUP = 50
TARGETS = {50: Target("<=", 1.15), 99: Target("<=", 1.2)}


async def round_trip(kubelet: TimedKubelet, name: str, ids: list[str]) -> float:
    """One Allocate for one container; its round trip in seconds."""
    started = time.perf_counter()
    await kubelet.allocate_ids(name, ids)
    return time.perf_counter() - started


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / MEASUREMENT
    rng = random.Random(1)
    figures: list[Figure] = []
    async with (
        TimedKubelet(directory) as kubelet,
        running(await launch("host", directory, {HOST: DEVICES}, workdir / "allocate-host.log")) as host,
        running(await launch("bare", directory, {BARE: DEVICES}, workdir / "allocate-bare.log")) as bare,
    ):
        servers = {HOST: host, BARE: bare}
        await wait_all(kubelet, [HOST, BARE], timeout=30)
        for count in (1, 4):
            samples: dict[str, list[float]] = {HOST: [], BARE: []}
            cpu: dict[str, float] = {}
            for n in range(WARMUP + settings.allocate_samples):
                if n == WARMUP:
                    cpu = {name: server.cpu_seconds() for name, server in servers.items()}
                ids = [f"r0-{i}" for i in rng.sample(range(DEVICES), count)]
                order = (HOST, BARE) if n % 2 else (BARE, HOST)
                for name in order:
                    took = await round_trip(kubelet, name, ids)
                    if n >= WARMUP:
                        samples[name].append(took)
            for pct, target in TARGETS.items():
                host, bare = (ms(percentile(samples[name], pct)) for name in (HOST, BARE))
                figures += compared(MEASUREMENT, f"{count} device(s) p{pct}", host, bare, "ms", target)
            per_call = {
                name: (server.cpu_seconds() - cpu[name]) / settings.allocate_samples * 1e6
                for name, server in servers.items()
            }
            figures += compared(
                MEASUREMENT,
                f"{count} device(s) server CPU per Allocate",
                round(per_call[HOST], 1),
                round(per_call[BARE], 1),
                "us",
            )
    return figures
