"""7. The real kubelet 1.32 device manager (``dpharness``): the host beside the Go reference plugin.

``stubplugin`` (the kubelet's own test stub, ``--fast-watch``) and ``devicehost run`` with the
example backend, each serving 4 devices of its own resource to the same ``dpharness``, measured
interleaved in one run: process start to allocatable, ``Allocate`` as the kubelet times it
(``ManagerImpl.Allocate``: the checkpoint write included) and the raw RPC on the plugin socket
(``probe``), and kubelet restart to allocatable again. Ratios are host / Go plugin.

Runs only when ``DEVICEHOST_KUBELET_PEER`` names the dir holding ``dpharness`` and ``stubplugin``
(a kubelet harness, not in this repository); otherwise it reports nothing and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from benchmarks.figures import Figure, ms, percentile
from benchmarks.procs import REPO, ServerProcess, launch, running
from benchmarks.settings import Settings

sys.path.insert(0, str(REPO / "tests" / "support"))  # the dpharness client is test support
from dpharness import Capacity, DpHarness, dpharness, peer_dir

MEASUREMENT = "kubelet"
DEVICES = 4
KINDS = ("go", "host")
START_TIMEOUT = 30.0
BACK_TIMEOUT = 15.0
SETTLE = 0.2
"""Seconds between two kubelet restarts."""


def resource(kind: str, n: int = 0) -> str:
    return f"{kind}{n}.example.com/widget"


async def launch_plugin(kind: str, peer: Path, directory: Path, name: str, log: Path) -> ServerProcess:
    """``go``: stubplugin; ``host``: ``devicehost run --backend example`` (registration mode
    ``auto`` registers on kubelet.sock: this kubelet writes no DEPRECATION file)."""
    if kind == "host":
        return await launch("host", directory, {name: DEVICES}, log)
    argv = [str(peer / "stubplugin"), "--dir", f"{directory}/", "--resource", name]
    argv += ["--devices", str(DEVICES), "--fast-watch", "--socket-name", f"stub-{name.split('.')[0]}.sock"]
    out = log.open("ab")
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
    )
    return ServerProcess(proc, started, out)


async def starts(peer: Path, kubelet: DpHarness, settings: Settings, workdir: Path) -> dict[str, list[float]]:
    """Seconds from spawning each plugin to the kubelet's allocatable reaching every device."""
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for n in range(1, settings.cold_starts + 1):
        for kind in KINDS:
            name = resource(kind, n)
            log = workdir / f"kubelet-{kind}.log"
            async with running(await launch_plugin(kind, peer, kubelet.directory, name, log)) as plugin:
                reached, count, _ = await kubelet.wait(name, DEVICES, timeout=START_TIMEOUT)
                if not reached:
                    raise RuntimeError(
                        f"{kind}: {name} allocatable {count} after {START_TIMEOUT} s; see {log}"
                    )
                samples[kind].append(time.monotonic() - plugin.started)
    return samples


async def allocations(
    kubelet: DpHarness, settings: Settings
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """``ManagerImpl.Allocate`` seconds per side, interleaved; and each side's raw RPC p50 (probe)."""
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for i in range(max(5, settings.allocate_samples // 10)):
        for kind in KINDS:
            allocation = await kubelet.allocate(f"{kind}-{i}", resource(kind), 1)
            if not allocation.ok:
                raise RuntimeError(f"{kind}: Allocate failed: {allocation.error}")
            samples[kind].append(allocation.allocate_us / 1e6)
            await kubelet.release(f"{kind}-{i}")
    raw: dict[str, float] = {}
    sockets = {"go": f"stub-{resource('go').split('.')[0]}.sock", "host": "devicehost-host0.*"}
    for kind, pattern in sockets.items():
        (socket,) = kubelet.directory.glob(pattern)
        device = "dev-0" if kind == "go" else "widget-0"
        probe = await kubelet.probe(socket, [device], max(5, settings.allocate_samples // 10))
        raw[kind] = probe["p50_us"] / 1e6
    return samples, raw


async def restarts(kubelet: DpHarness, settings: Settings) -> dict[str, list[float]]:
    """Seconds from asking the kubelet to restart to each side's resource allocatable again."""
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(settings.kubelet_restarts):
        await asyncio.sleep(SETTLE)
        asked = time.monotonic()
        await kubelet.restart()
        back: dict[str, float] = {}
        while len(back) < len(KINDS):
            report: Capacity = await kubelet.capacity()
            now = time.monotonic()
            for kind in KINDS:
                if kind not in back and report.allocatable.get(resource(kind), 0) >= DEVICES:
                    back[kind] = now - asked
            if now - asked > BACK_TIMEOUT:
                raise RuntimeError(f"not back {BACK_TIMEOUT} s after a kubelet restart: {report}")
        for kind, seconds in back.items():
            samples[kind].append(seconds)
    return samples


def side_by_side(
    name: str, samples: dict[str, list[float]], stat: Callable[[list[float]], float]
) -> list[Figure]:
    host, go = ms(stat(samples["host"])), ms(stat(samples["go"]))
    return [
        Figure(MEASUREMENT, name, host, "ms", baseline=go),
        Figure(MEASUREMENT, f"{name} host/go", round(host / go, 3), "x"),
    ]


@contextlib.asynccontextmanager
async def both_serving(peer: Path, kubelet: DpHarness, workdir: Path) -> AsyncIterator[None]:
    """One long-lived plugin of each kind (resource ``<kind>0``), registered."""
    async with contextlib.AsyncExitStack() as stack:
        for kind in KINDS:
            log = workdir / f"kubelet-{kind}.log"
            await stack.enter_async_context(
                running(await launch_plugin(kind, peer, kubelet.directory, resource(kind), log))
            )
            reached, count, _ = await kubelet.wait(resource(kind), DEVICES, timeout=START_TIMEOUT)
            if not reached:
                raise RuntimeError(f"{kind}: allocatable {count}; see {log}")
        yield


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    peer, why = peer_dir()
    if peer is None:
        print(f"   skipped: {why}", file=sys.stderr, flush=True)
        return []
    p50, p99 = (lambda s: percentile(s, 50)), (lambda s: percentile(s, 99))
    async with dpharness(peer, workdir / "kubelet-dp", log=workdir / "kubelet-dpharness.log") as kubelet:
        started = await starts(peer, kubelet, settings, workdir)
        async with both_serving(peer, kubelet, workdir):
            allocated, raw = await allocations(kubelet, settings)
            back = await restarts(kubelet, settings)
    return [
        *side_by_side("process start to allocatable p50", started, p50),
        *side_by_side("process start to allocatable max", started, max),
        *side_by_side("Allocate through the device manager p50", allocated, p50),
        *side_by_side("Allocate through the device manager p99", allocated, p99),
        *side_by_side("raw Allocate RPC (probe) p50", {k: [v] for k, v in raw.items()}, p50),
        *side_by_side("kubelet restart to allocatable p50", back, p50),
        *side_by_side("kubelet restart to allocatable max", back, max),
    ]
