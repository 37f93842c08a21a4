"""The publisher bounds the API server's load: a pool is written at most once a second, the
changes inside the second merged into one write at its end, the last one never lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from drafakes import CountingCluster
from hostfakes import captured_logs

from devicehost import Device, Health
from devicehost.host.dra import names
from devicehost.host.dra.publisher import MIN_INTERVAL, Publisher
from devicehost.host.dra.slices import Placement, pool_specs

NODE, DRIVER = "node-a", "example.com"
FLAPPING = "w600"
"""In the 5th slice of 1,000 devices (w512 to w639)."""


class TimedCluster(CountingCluster):
    """The in-memory API server, noting when each slice is written (created, replaced, deleted)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[float, str]] = []

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.written.append((time.monotonic(), body["metadata"]["name"]))
        return await super().create_slice(body)

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.written.append((time.monotonic(), body["metadata"]["name"]))
        return await super().replace_slice(body)

    async def delete_slice(self, name: str) -> None:
        self.written.append((time.monotonic(), name))
        await super().delete_slice(name)

    def shortest_gap(self) -> float:
        """The shortest time between two writes of one slice (inf: none written twice)."""
        last: dict[str, float] = {}
        gap = float("inf")
        for at, name in self.written:
            if name in last:
                gap = min(gap, at - last[name])
            last[name] = at
        return gap

    def devices(self) -> set[str]:
        return {d["name"] for body in self.stored.values() for d in body["spec"]["devices"]}


class Resource:
    """One resource's devices as the driver hands them to the publisher (pool ``resource``)."""

    def __init__(self, publisher: Publisher, resource: str, count: int) -> None:
        self.publisher, self.resource, self.count = publisher, resource, count
        self.placement = Placement()

    def want(self, unhealthy: Sequence[str] = ()) -> None:
        table = [
            Device(f"w{n}", Health.UNHEALTHY if f"w{n}" in unhealthy else Health.HEALTHY)
            for n in range(self.count)
        ]
        pool = f"{NODE}/{self.resource.partition('/')[2]}"
        specs = pool_specs(NODE, DRIVER, pool, table, self.placement)
        self.publisher.want_pool(
            self.resource,
            [(names.slice_name(NODE, DRIVER, self.resource, i), spec) for i, spec in enumerate(specs)],
        )


@asynccontextmanager
async def running(publisher: Publisher) -> AsyncIterator[Publisher]:
    task = asyncio.create_task(publisher.run())
    publisher.open()  # the kubelet registered the driver
    try:
        yield publisher
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def synced(publisher: Publisher, within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        await publisher.synced()


async def test_a_device_flapping_every_100ms_costs_its_slice_one_write_a_second() -> None:
    """1,000 devices, one of them unhealthy and back every 100 ms for 5 s: 51 changes."""
    cluster = TimedCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    widgets = Resource(publisher, "example.com/widget", 1000)
    async with running(publisher):
        widgets.want()
        await synced(publisher)
        assert len(cluster.stored) == 8
        first, lists = len(cluster.written), cluster.calls["slices"]
        generations = {b["spec"]["pool"]["generation"] for b in cluster.stored.values()}
        started = time.monotonic()
        for change in range(51):  # the last one leaves it unhealthy
            widgets.want([FLAPPING] if change % 2 == 0 else [])
            await asyncio.sleep(0.1)
        flapped = time.monotonic() - started
        await synced(publisher, within=2 * MIN_INTERVAL)
    writes = cluster.written[first:]
    assert {name for _, name in writes} == {names.slice_name(NODE, DRIVER, "example.com/widget", 4)}
    # at most one write a second while it flapped (fewer where a second ended as it began) and
    # the last state once more at the end: not 51
    assert 1 <= len(writes) <= flapped // MIN_INTERVAL + 2, writes
    assert cluster.shortest_gap() >= MIN_INTERVAL - 0.001
    assert cluster.devices() == {f"w{n}" for n in range(1000)} - {FLAPPING}  # the final health
    assert {b["spec"]["pool"]["generation"] for b in cluster.stored.values()} == generations
    # nothing spins: a second costs a list when a change comes in it and one at its end, and one
    # more when its end found nothing to write (the flap was back where it was published), so
    # the next change is written at once: at most 3 a second, not one per change (51)
    assert cluster.calls["slices"] - lists <= 3 * (flapped // MIN_INTERVAL + 2)


async def test_changes_inside_the_interval_are_written_once_at_its_end_the_newest_wins() -> None:
    cluster = TimedCluster()
    publisher = Publisher(cluster, NODE, DRIVER, min_interval=0.5)
    widgets = Resource(publisher, "example.com/widget", 3)
    async with running(publisher):
        widgets.want()
        await synced(publisher)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        widgets.want(["w0"])  # written at once: nothing was written in the last 0.5 s
        await cluster.wait(lambda c: c.devices() == {"w1", "w2"})
        assert time.monotonic() - started < 0.25
        widgets.want(["w0", "w1"])
        widgets.want(["w1"])
        await asyncio.sleep(0.2)
        assert cluster.devices() == {"w1", "w2"}  # held: inside the interval
        await synced(publisher)
        assert time.monotonic() - started >= 0.5
    assert cluster.devices() == {"w0", "w2"}  # the newest wanted, not the one before it
    assert len(cluster.written) == 3
    assert cluster.shortest_gap() >= 0.5 - 0.001


async def test_each_pool_has_its_own_interval_and_a_dropped_pool_waits_for_it_too() -> None:
    cluster = TimedCluster()
    publisher = Publisher(cluster, NODE, DRIVER, min_interval=0.5)
    widgets = Resource(publisher, "example.com/widget", 2)
    gadgets = Resource(publisher, "example.com/gadget", 2)
    widgets.want()
    assert await publisher.sync(coalesce=True) is None
    widgets.want(["w0"])
    gadgets.want()
    held = await publisher.sync(coalesce=True)
    assert held is not None
    assert 0.3 < held <= 0.5
    assert cluster.devices() == {"w0", "w1"} | {"w0", "w1"}  # the widgets' change waits
    assert names.slice_name(NODE, DRIVER, "example.com/gadget") in cluster.stored  # its own pool: at once
    publisher.drop_pool("example.com/gadget")
    assert await publisher.sync(coalesce=True) is not None
    assert names.slice_name(NODE, DRIVER, "example.com/gadget") in cluster.stored  # written just now
    await asyncio.sleep(0.5)
    assert await publisher.sync(coalesce=True) is None
    assert set(cluster.stored) == {names.slice_name(NODE, DRIVER, "example.com/widget")}
    assert cluster.devices() == {"w1"}
    await publisher.sync()  # without coalescing (the host stopping): at once
    assert cluster.shortest_gap() >= 0.5 - 0.001


async def test_a_pool_shrinking_inside_the_interval_is_written_whole_at_its_end() -> None:
    cluster = TimedCluster()
    publisher = Publisher(cluster, NODE, DRIVER, min_interval=0.3)
    widgets = Resource(publisher, "example.com/widget", 300)
    widgets.want()
    await publisher.sync(coalesce=True)
    widgets.count = 100
    widgets.want()
    assert await publisher.sync(coalesce=True) is not None
    assert len(cluster.stored) == 3  # nothing deleted yet: the pool waits whole
    await asyncio.sleep(0.3)
    assert await publisher.sync(coalesce=True) is None  # its deletions do not hold its rewrite
    assert [b["spec"]["pool"] for b in cluster.stored.values()] == [
        {"name": f"{NODE}/widget", "generation": 2, "resourceSliceCount": 1}
    ]
    assert cluster.devices() == {f"w{n}" for n in range(100)}
    assert cluster.calls["delete_slice"] == 2


async def test_a_conflicting_write_backs_off_and_is_said_once() -> None:
    cluster = TimedCluster()
    conflict = "replacing ResourceSlice node-a-example.com-widget: 409 Conflict"
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        widgets = Resource(publisher, "example.com/widget", 200)
        async with running(publisher):
            widgets.want()
            await synced(publisher)
            cluster.failing["replace_slice"] = conflict
            widgets.want(["w0"])
            await asyncio.sleep(2.5)
            # tried once a second at most (the interval, then a backoff growing past it), not in a spin
            assert 2 <= cluster.calls["replace_slice"] <= 3, cluster.calls
            assert cluster.shortest_gap() >= MIN_INTERVAL - 0.001
            del cluster.failing["replace_slice"]
            await synced(publisher, within=3)
    failed = [e for e in logs if e["event"] == "publishing ResourceSlices failed, retrying with backoff"]
    assert [e["error"] for e in failed] == [conflict]
    assert len([e for e in logs if e["event"] == "ResourceSlices published again"]) == 1
    assert "w0" not in cluster.devices()
