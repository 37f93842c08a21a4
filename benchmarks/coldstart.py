"""5. Cold start: from launching the process to its first resource registered and streaming.

``devicehost run`` with the example backend (one resource of 16 devices) against the bare
servicer started the same way (``python -m benchmarks.bare_server``); the kubelet is already up.
Beside the wall time it reports the CPU time each process had used when the kubelet saw it
registered (user + system, all threads): imports and start-up work, little moved by other load.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.kubelet import TimedKubelet, wait_all
from benchmarks.procs import launch, running
from benchmarks.settings import Settings

MEASUREMENT = "coldstart"
TARGET = Target("<=", 150)
RATIO_TARGET = Target("<=", 1.5)


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    directory = workdir / MEASUREMENT
    samples: dict[str, list[float]] = {"host": [], "bare": []}
    cpu: dict[str, list[float]] = {"host": [], "bare": []}
    async with TimedKubelet(directory) as kubelet:
        for n in range(settings.cold_starts):
            for kind, times in samples.items():
                name = f"{kind}.example.com/c{n}"
                log = workdir / f"coldstart-{kind}.log"
                async with running(await launch(kind, directory, {name: 16}, log)) as server:
                    times.append(await wait_all(kubelet, [name], timeout=30) - server.started)
                    cpu[kind].append(server.cpu_seconds())
    host, bare = samples["host"], samples["bare"]
    return [
        *compared(
            MEASUREMENT,
            "launch to first registered p50",
            ms(percentile(host, 50)),
            ms(percentile(bare, 50)),
            "ms",
            RATIO_TARGET,
            TARGET,
        ),
        *compared(
            MEASUREMENT,
            "CPU to first registered p50",
            ms(percentile(cpu["host"], 50)),
            ms(percentile(cpu["bare"], 50)),
            "ms",
        ),
        *compared(MEASUREMENT, "launch to first registered max", ms(max(host)), ms(max(bare)), "ms"),
    ]
