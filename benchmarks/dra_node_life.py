"""A node's life with many claims: a reboot's start, and prepare and unprepare as claims pile up.

The real host (:func:`devicehost.testing.host.running_host`, in this process) serves the
benchmark's backend through DRA to the kubelet stand-in, with the in-memory API server
(:class:`~devicehost.testing.cluster.ClusterStandIn`); claims are prepared and unprepared over
the wire, as the kubelet calls them.

- **reboot**: 256 claims prepared, the host and kubelet stopped and the CDI dir emptied (a
  tmpfs after a reboot: here in ``/dev/shm``, as ``/var/run/cdi`` is a tmpfs on a node), the
  checkpoint kept (on disk). Measured: from the host's start to the moment the
  kubelet registered its driver, with every claim's spec back on disk (checked then). Target:
  under 1 s. Baseline (**bare**): the least any driver must do there, in this process: read the
  checkpoint and write each claim's spec again (temporary file, fsync, rename, fsync of the dir).
- **held**: with 1, 16, 64 and 256 claims already prepared, one NodePrepareResources of one new
  claim and one NodeUnprepareResources of it, p50. Baseline: the same call with 1 claim held;
  target: the cost flat (at most 1.5 times the baseline) as claims pile up. This node's dirs
  (its checkpoint too) are on the tmpfs: an fsync of the checkpoint costs any driver the same,
  and on a disk shared with other work its noise hides what the host itself adds per claim held.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import devicehost
from benchmarks.figures import Figure, Target, ms, percentile
from benchmarks.settings import Settings
from devicehost import ClaimRequest, ContainerAllocation, Device, Resource
from devicehost.standin import KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host

MEASUREMENT = "dra_node_life"
DRIVER = "life.example.com"
RESOURCE = f"{DRIVER}/card"
NODE = "bench-node"
CLAIMS = 256
BATCH = 32
"""Claims per NodePrepareResources call while filling the node."""
REBOOT_TARGET = Target("<", 1000.0)
FLAT_TARGET = Target("<=", 1.5)
TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None
"""Where the CDI dirs go: a tmpfs, as ``/var/run/cdi`` is on a node (else the default temp dir)."""


class Cards:
    """CLAIMS + 8 cards; allocate answers an environment variable and a device node."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource(RESOURCE, tuple(Device(f"card-{n}") for n in range(CLAIMS + 8)))]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"CARDS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_restore(self, device_ids: tuple[str, ...], claim: ClaimRequest) -> None:
        return None


def held_counts(settings: Settings) -> tuple[int, ...]:
    return (1, CLAIMS) if settings.cold_starts < 2 else (1, 16, 64, CLAIMS)


@asynccontextmanager
async def node(root: Path, cluster: ClusterStandIn, cdi: Path) -> AsyncIterator[KubeletStandIn]:
    """The kubelet stand-in and the host serving ``Cards`` through DRA, both in ``root``, the
    claims' CDI specs in ``cdi``."""
    registry = root / "registry"
    async with (
        KubeletStandIn(root / "device-plugins", registry) as kubelet,
        running_host(
            kubelet.device_plugins_dir,
            {"cards": Cards()},
            cluster=cluster,
            serve_through={"cards": "dra"},
            node_name=NODE,
            dra_plugins_dir=root / "plugins",
            plugins_registry_dir=registry,
            cdi_dir=cdi,
            device_release=False,
        ),
    ):
        await kubelet.dra.wait_for_driver(DRIVER, timeout=30)
        yield kubelet


async def fill(kubelet: KubeletStandIn, cluster: ClusterStandIn, count: int) -> list[tuple[str, str, str]]:
    """``count`` claims of one card each, prepared in calls of :data:`BATCH`."""
    await cluster.wait(lambda c: len(c.devices(DRIVER)) >= CLAIMS, timeout=30)
    refs = [cluster.allocate(DRIVER) for _ in range(count)]
    for start in range(0, count, BATCH):
        await kubelet.dra.prepare(DRIVER, refs[start : start + BATCH])
    return refs


async def reboot_once(root: Path, cluster: ClusterStandIn, cdi: Path, uids: Sequence[str]) -> float:
    """Empty the CDI dir, start kubelet and host; seconds until registered with every spec there."""
    emptied(cdi)
    started = time.perf_counter()
    async with node(root, cluster, cdi):
        took = time.perf_counter() - started
        missing = missing_specs(cdi, uids)
        if missing:
            raise AssertionError(f"registered with {len(missing)} claims' specs missing")
    return took


def emptied(directory: Path) -> None:
    """``directory`` empty, as a tmpfs after a reboot."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()


def missing_specs(cdi: Path, uids: Sequence[str]) -> list[str]:
    return [u for u in uids if not (cdi / f"devicehost-{DRIVER}_claim-{u}.json").exists()]


def bare_restore(root: Path, cdi: Path) -> float:
    """Seconds to read the checkpoint and write every claim's spec again, durably, by hand."""
    emptied(cdi)
    started = time.perf_counter()
    raw = json.loads((root / "plugins" / DRIVER / "devicehost-claims.json").read_text())
    for uid, claim in raw["claims"].items():
        path = cdi / f"devicehost-{DRIVER}_claim-{uid}.json"
        fd, temp = tempfile.mkstemp(dir=cdi, suffix=".tmp")
        with os.fdopen(fd, "w") as file:
            file.write(json.dumps(claim["spec"], indent=2) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
        directory = os.open(cdi, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(directory)
        os.close(directory)
    return time.perf_counter() - started


async def one_call_each(
    kubelet: KubeletStandIn, cluster: ClusterStandIn, samples: int
) -> tuple[float, float]:
    """p50 seconds of preparing one new claim, and of unpreparing it, ``samples`` times."""
    prepares, unprepares = [], []
    for _ in range(samples):
        ref = cluster.allocate(DRIVER)
        started = time.perf_counter()
        await kubelet.dra.prepare(DRIVER, [ref])
        prepares.append(time.perf_counter() - started)
        started = time.perf_counter()
        await kubelet.dra.unprepare(DRIVER, [ref])
        unprepares.append(time.perf_counter() - started)
        del cluster.claims[(ref[0], ref[2])]
    return percentile(prepares, 50), percentile(unprepares, 50)


async def held_figures(root: Path, cdi: Path, settings: Settings) -> list[Figure]:
    samples = max(9, settings.allocate_samples // 10)
    cluster = ClusterStandIn()
    found: dict[int, tuple[float, float]] = {}
    async with node(root, cluster, cdi) as kubelet:
        held = 0
        for count in held_counts(settings):
            await fill(kubelet, cluster, count - held)
            held = count
            found[count] = await one_call_each(kubelet, cluster, samples)
    figures = []
    for index, call in enumerate(("prepare", "unprepare")):
        base = ms(found[1][index])
        for count, times in found.items():
            value = ms(times[index])
            target = FLAT_TARGET if count == CLAIMS else None
            figures.append(Figure(MEASUREMENT, f"{call}, {count} held p50", value, "ms", base))
            figures.append(
                Figure(
                    MEASUREMENT, f"{call}, {count} held / 1 held", round(value / base, 3), "x", target=target
                )
            )
    return figures


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    root = workdir / "node-life"
    (root / "reboot").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dhb-cdi-", dir=TMPFS) as tmpfs:
        cdi = Path(tmpfs)
        cluster = ClusterStandIn()
        async with node(root / "reboot", cluster, cdi / "host") as kubelet:
            uids = [ref[1] for ref in await fill(kubelet, cluster, CLAIMS)]
        reboots, bare = [], []
        for _ in range(max(1, settings.cold_starts)):
            reboots.append(await reboot_once(root / "reboot", cluster, cdi / "host", uids))
            bare.append(bare_restore(root / "reboot", cdi / "bare"))
        held = await held_figures(cdi / "held-node", cdi / "held", settings)
    host_ms, bare_ms = ms(percentile(reboots, 50)), ms(percentile(bare, 50))
    name = f"reboot with {CLAIMS} claims: start to registered, specs rewritten p50"
    return [
        Figure(MEASUREMENT, name, host_ms, "ms", bare_ms, REBOOT_TARGET),
        Figure(MEASUREMENT, f"{name} host/bare", round(host_ms / bare_ms, 3), "x"),
        *held,
    ]
