"""Publishing a pool of 1,000 devices: time and API writes, the host against a bare publisher.

Both publish one resource's 1,000 devices on one node as ResourceSlices (128 devices a slice, so
one pool of 8) to the in-memory API server (:class:`~devicehost.standin.apiserver.ApiServerStandIn`,
counting its create, replace and delete calls), in this process, one after the other:

- **host**: what the host's driver does on every change of a resource's table
  (:class:`~devicehost.host.dra.slices.Placement` and
  :func:`~devicehost.host.dra.slices.pool_specs` to build the pool, then
  :meth:`~devicehost.host.dra.publisher.Publisher.want_pool` and a sync that lists the published
  slices, compares and writes the difference);
- **bare**: the simplest publisher that keeps a multi-slice pool valid the way the API describes
  it, written by hand: the healthy devices in chunks of 128, the generation moved up on every
  change and every slice of the pool rewritten with it (it lists the slices too, for their
  resourceVersions); a change that changes nothing writes nothing.

Three scenarios, the same for both: (a) the first publish of 1,000 devices (an empty API
server); (b) one device (in the 5th slice) going unhealthy and back, 10 times (20 changes);
(c) a rediscovery that finds the same 1,000 devices (new ``Device`` values, equal ones): a
full compare with the published slices, 0 writes expected. Each round starts from an empty
API server; the times are medians over the rounds (b: over every change of every round).

The in-memory API server answers at once, so the times are what the publisher itself costs
(building the slices, comparing, serialising nothing): on a cluster each write adds a round trip
to the API server, which is what the write counts stand for.

Then the API server's load under flapping (issue 25 item 6): the publisher runs as the host runs
it (its own task, woken by each change) while one of the 1,000 devices goes unhealthy and back
every 100 ms for ``flap_seconds``, once as the host has it (a pool written at most once a second,
the changes inside merged) and once with no interval (every change written at once: the
baseline). Reported: the API writes per minute while it flaps, the shortest time between two
writes of the flapping slice, and the publish latency of each change (from the change to the end
of the first sync after it that left the slices what was wanted, the change's state or a newer
one), p50 and p99. The published pool must end at the device's last health.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.settings import Settings
from devicehost import Device, Health
from devicehost.host.dra import names
from devicehost.host.dra.publisher import MIN_INTERVAL, Publisher
from devicehost.host.dra.slices import MAX_DEVICES, Placement, device_entry, pool_specs, slice_body
from devicehost.standin.apiserver import NODE_UID, ApiServerStandIn

MEASUREMENT = "dra_publish"
NODE, DRIVER, RESOURCE, POOL = "bench-node", "dra.example.com", "dra.example.com/gpu", "bench-node/gpu"
DEVICES = 1000
FLAPS = 10
FLAPPING = "gpu-600"
"""In the 5th slice (devices 512 to 639)."""
SLICES = -(-DEVICES // MAX_DEVICES)
WRITE_TARGETS = {
    "first": Target("==", SLICES),
    "flap": Target("<=", 2 * FLAPS),
    "rediscover": Target("==", 0),
}
RATIO_TARGET = Target("<=", 2.0)
FLAP_PERIOD = 0.1
FLAPPING_SLICE = names.slice_name(NODE, DRIVER, RESOURCE, 4)
FLAP_TARGETS = {
    "per minute": Target("<=", 66.0),  # one slice written once a second, with 10% to spare
    "gap": Target(">=", MIN_INTERVAL * 1000 - 1),
    "p99": Target("<=", (MIN_INTERVAL + 0.2) * 1000),
}


def rounds_for(settings: Settings) -> int:
    """Rounds per publisher: 20 in full mode, 8 quick, 4 minimal (under a second each)."""
    return max(4, settings.cold_starts * 4)


class CountedApiServer(ApiServerStandIn):
    """The in-memory API server, counting the writes it is asked for, and when the flapping
    device's slice was replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flapping_writes: list[float] = []

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.writes += 1
        return await super().create_slice(body)

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.writes += 1
        if body["metadata"]["name"] == FLAPPING_SLICE:
            self.flapping_writes.append(time.perf_counter())
        return await super().replace_slice(body)

    async def delete_slice(self, name: str) -> None:
        self.writes += 1
        await super().delete_slice(name)


def table(unhealthy: str = "") -> list[Device]:
    """The resource's devices, as a fresh discovery hands them over."""
    return [
        Device(f"gpu-{n}", Health.UNHEALTHY if f"gpu-{n}" == unhealthy else Health.HEALTHY)
        for n in range(DEVICES)
    ]


class TimedPublisher(Publisher):
    """The host's publisher, noting the start and end of each sync that left nothing held back."""

    def __init__(self, cluster: ApiServerStandIn, min_interval: float = MIN_INTERVAL) -> None:
        super().__init__(cluster, NODE, DRIVER, min_interval)
        self.done: list[tuple[float, float]] = []

    async def sync(self, coalesce: bool = False) -> float | None:
        started = time.perf_counter()
        held = await super().sync(coalesce)
        if held is None:
            self.done.append((started, time.perf_counter()))
        return held


class HostPublisher:
    """The host's way: stable placement, a diff of the pool, the generation as the publisher decides."""

    def __init__(self, cluster: ApiServerStandIn, min_interval: float = MIN_INTERVAL) -> None:
        self.publisher = TimedPublisher(cluster, min_interval)
        self.placement = Placement()

    def want(self, devices: Sequence[Device]) -> None:
        """What the driver does on a change of the table: the pool built, handed over."""
        specs = pool_specs(NODE, DRIVER, POOL, devices, self.placement)
        self.publisher.want_pool(
            RESOURCE, [(names.slice_name(NODE, DRIVER, RESOURCE, i), spec) for i, spec in enumerate(specs)]
        )

    async def publish(self, devices: Sequence[Device]) -> None:
        self.want(devices)
        await self.publisher.sync()  # the run loop's sync, called here without its wake-up


class BarePublisher:
    """Chunks of 128 healthy devices; every change moves the generation and rewrites every slice."""

    def __init__(self, cluster: ApiServerStandIn) -> None:
        self.cluster = cluster
        self.generation = 0
        self.last: list[list[dict[str, Any]]] | None = None

    async def publish(self, devices: Sequence[Device]) -> None:
        entries = [device_entry(d) for d in devices if d.health is Health.HEALTHY]
        chunks = [entries[i : i + MAX_DEVICES] for i in range(0, len(entries), MAX_DEVICES)] or [[]]
        if chunks == self.last:
            return
        self.generation += 1
        published = await self.cluster.slices(NODE, DRIVER)
        wanted = {names.slice_name(NODE, DRIVER, RESOURCE, i): chunk for i, chunk in enumerate(chunks)}
        for name in published.keys() - wanted.keys():
            await self.cluster.delete_slice(name)
        for name, chunk in wanted.items():
            pool = {"name": POOL, "generation": self.generation, "resourceSliceCount": len(chunks)}
            spec = {"driver": DRIVER, "nodeName": NODE, "pool": pool, "devices": chunk}
            current = published.get(name)
            if current is None:
                await self.cluster.create_slice(slice_body(name, (NODE, NODE_UID), spec))
            else:
                version = current["metadata"]["resourceVersion"]
                await self.cluster.replace_slice(slice_body(name, (NODE, NODE_UID), spec, version))
        self.last = chunks


def check(cluster: ApiServerStandIn, healthy: int) -> None:
    """The pool is whole: SLICES slices of one generation and count, ``healthy`` devices in all."""
    pools = {
        (b["spec"]["pool"]["generation"], b["spec"]["pool"]["resourceSliceCount"])
        for b in cluster.stored.values()
    }
    published = sum(len(b["spec"]["devices"]) for b in cluster.stored.values())
    if len(cluster.stored) != SLICES or len(pools) != 1 or published != healthy:
        raise AssertionError(f"{len(cluster.stored)} slices, pools {pools}, {published} devices published")


async def one_round(kind: str) -> tuple[float, list[float], float, tuple[int, int, int]]:
    """(first publish s, each flap's s, rediscovery s, (first, flap, rediscovery) writes)."""
    cluster = CountedApiServer()
    publisher = HostPublisher(cluster) if kind == "host" else BarePublisher(cluster)
    started = time.perf_counter()
    await publisher.publish(table())
    first = time.perf_counter() - started
    check(cluster, DEVICES)
    first_writes = cluster.writes
    flaps: list[float] = []
    for _ in range(FLAPS):
        for unhealthy, healthy in ((FLAPPING, DEVICES - 1), ("", DEVICES)):
            started = time.perf_counter()
            await publisher.publish(table(unhealthy))
            flaps.append(time.perf_counter() - started)
            check(cluster, healthy)
    flap_writes = cluster.writes - first_writes
    started = time.perf_counter()
    await publisher.publish(table())
    rediscovery = time.perf_counter() - started
    return first, flaps, rediscovery, (first_writes, flap_writes, cluster.writes - first_writes - flap_writes)


async def flapping(min_interval: float, seconds: float) -> tuple[float, float, list[float]]:
    """(writes per minute while it flapped, shortest s between two writes of the flapping slice,
    each change's publish latency in s), the publisher running with ``min_interval``."""
    cluster = CountedApiServer()
    host = HostPublisher(cluster, min_interval)
    running = asyncio.create_task(host.publisher.run())
    host.publisher.open()  # the kubelet registered the driver
    try:
        host.want(table())
        async with asyncio.timeout(10):
            await host.publisher.synced()
        await asyncio.sleep(min_interval)  # the first publish's interval over: a device long healthy
        before, changes = cluster.writes, []
        started = time.perf_counter()
        while (now := time.perf_counter()) < started + seconds:
            changes.append(now)
            host.want(table(FLAPPING if len(changes) % 2 else ""))
            await asyncio.sleep(max(0.0, started + len(changes) * FLAP_PERIOD - time.perf_counter()))
        per_minute = (cluster.writes - before) * 60 / seconds
        async with asyncio.timeout(10):
            await host.publisher.synced()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    check(cluster, DEVICES - len(changes) % 2)  # the last change's health, whatever was merged
    writes = cluster.flapping_writes
    gap = min((b - a for a, b in itertools.pairwise(writes)), default=float("inf"))
    latencies = [min(end for start, end in host.publisher.done if start >= at) - at for at in changes]
    return per_minute, gap, latencies


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    times: dict[str, dict[str, list[float]]] = {
        k: {"first": [], "flap": [], "rediscover": []} for k in ("host", "bare")
    }
    writes: dict[str, tuple[int, int, int]] = {}
    for _ in range(rounds_for(settings)):
        for kind in ("host", "bare"):  # alternated, so both see the same machine
            first, flaps, rediscovery, counted = await one_round(kind)
            times[kind]["first"].append(first)
            times[kind]["flap"] += flaps
            times[kind]["rediscover"].append(rediscovery)
            if writes.setdefault(kind, counted) != counted:
                raise AssertionError(f"{kind}: writes {counted} in one round, {writes[kind]} in another")
    host, bare = times["host"], times["bare"]
    figures: list[Figure] = []
    for key, label in (
        ("first", f"first publish of {DEVICES} devices p50"),
        ("flap", "one flap (unhealthy or back) p50"),
        ("rediscover", "rediscovery, nothing changed p50"),
    ):
        figures += compared(
            MEASUREMENT,
            label,
            ms(percentile(host[key], 50)),
            ms(percentile(bare[key], 50)),
            "ms",
            RATIO_TARGET if key == "first" else None,
        )
    for index, (key, label) in enumerate(
        (
            ("first", f"API writes, first publish ({SLICES} slices)"),
            ("flap", f"API writes, one device unhealthy and back {FLAPS} times"),
            ("rediscover", "API writes, rediscovery with nothing changed"),
        )
    ):
        figures.append(
            Figure(
                MEASUREMENT, label, writes["host"][index], "writes", writes["bare"][index], WRITE_TARGETS[key]
            )
        )
    return figures + await flapping_figures(settings.flap_seconds)


async def flapping_figures(seconds: float) -> list[Figure]:
    """The host's publisher beside one that writes every change, one device flapping."""
    host_rate, host_gap, host_latency = await flapping(MIN_INTERVAL, seconds)
    every_rate, every_gap, every_latency = await flapping(0.0, seconds)
    flaps = f"one of {DEVICES} devices flapping every {FLAP_PERIOD * 1000:g} ms for {seconds:g} s"
    figures = compared(
        MEASUREMENT,
        f"API writes per minute, {flaps}",
        round(host_rate, 1),
        round(every_rate, 1),
        "writes/min",
        target=FLAP_TARGETS["per minute"],
    )
    figures.append(
        Figure(
            MEASUREMENT,
            "shortest time between two writes of the flapping slice",
            ms(host_gap),
            "ms",
            ms(every_gap),
            FLAP_TARGETS["gap"],
        )
    )
    for pct in (50, 99):
        figures += compared(
            MEASUREMENT,
            f"publish latency under flapping p{pct}",
            ms(percentile(host_latency, pct)),
            ms(percentile(every_latency, pct)),
            "ms",
            target=FLAP_TARGETS["p99"] if pct == 99 else None,
        )
    return figures
