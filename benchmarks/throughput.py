"""6. Throughput: Allocates per second from 8 concurrent clients across 8 resources, and errors.

Each client is a task in this process with its own resource (its own socket and channel); the
host and the bare servicer each get the same run, one after the other. The server's CPU time per
Allocate comes from /proc.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc

from benchmarks.figures import Figure, Target, compared
from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import ServerProcess, launch, running
from benchmarks.settings import Settings

MEASUREMENT = "throughput"
CLIENTS = 8
DEVICES = 16


async def client(kubelet: TimedKubelet, name: str, index: int, deadline: float) -> tuple[int, int]:
    """Allocate one random device at a time until ``deadline``; (successes, errors)."""
    rng = random.Random(index)
    done = errors = 0
    while time.monotonic() < deadline:
        try:
            await kubelet.allocate_ids(name, [f"t{index}-{rng.randrange(DEVICES)}"])
            done += 1
        except grpc.aio.AioRpcError:
            errors += 1
    return done, errors


async def load(
    kubelet: TimedKubelet, server: ServerProcess, names: list[str], seconds: float
) -> dict[str, float]:
    cpu = server.cpu_seconds()
    started = time.monotonic()
    results = await asyncio.gather(
        *(client(kubelet, name, i, started + seconds) for i, name in enumerate(names))
    )
    took = time.monotonic() - started
    done = sum(d for d, _ in results)
    return {
        "rate": round(done / took, 1),
        "errors": sum(e for _, e in results),
        "cpu_us": round((server.cpu_seconds() - cpu) / max(done, 1) * 1e6, 1),
    }


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / MEASUREMENT
    names = {kind: [f"{kind}.example.com/t{i}" for i in range(CLIENTS)] for kind in ("host", "bare")}
    runs: dict[str, dict[str, float]] = {}
    async with TimedKubelet(directory) as kubelet:
        for kind, kind_names in names.items():
            log = workdir / f"throughput-{kind}.log"
            async with running(
                await launch(kind, directory, dict.fromkeys(kind_names, DEVICES), log)
            ) as server:
                await wait_all(kubelet, kind_names, timeout=30)
                runs[kind] = await load(kubelet, server, kind_names, settings.throughput_seconds)
    host, bare = runs["host"], runs["bare"]
    return [
        *compared(MEASUREMENT, f"{CLIENTS} clients: Allocates per second", host["rate"], bare["rate"], "1/s"),
        Figure(MEASUREMENT, "errors", host["errors"], "", bare["errors"], Target("==", 0)),
        Figure(MEASUREMENT, "server CPU per Allocate", host["cpu_us"], "us", bare["cpu_us"]),
    ]
