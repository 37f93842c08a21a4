"""Claims the scheduler allocated, held through DRA before the kubelet prepares them
(``host/dra/allocations.py``): the in-memory API server's claim watch, a real Backend and
DeviceTable behind a fake resource server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from drafakes import CountingCluster, Recorder, attached, fake_server, widgets

from devicehost.host.dra.allocated import Attached
from devicehost.host.dra.allocations import AllocationWatch
from devicehost.host.dra.claimwatch import ClaimWatch
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation
from devicehost.host.inventory import DEVICE_PLUGIN, DRA
from devicehost.host.serving.table import DeviceTable

DRIVER = "example.com"
WIDGET = "example.com/widget"
POOL = "node-a/widget"


async def never(seen: int) -> int:
    await asyncio.Event().wait()
    return seen


async def eventually(check: Callable[[], bool]) -> None:
    """``check`` holds within a second (the stand-in's watch looks every 50 ms)."""
    async with asyncio.timeout(1):
        while not check():
            await asyncio.sleep(0.01)


class Rig:
    """The watch over one widget resource, and what it reads of it."""

    def __init__(self, watch: AllocationWatch, resources: dict[str, Attached], table: DeviceTable) -> None:
        self.watch = watch
        self.resources = resources
        self.table = table

    def masked(self) -> frozenset[str]:
        """What the device plugin side must not give out now."""
        return self.table.view().masked(DEVICE_PLUGIN)


@asynccontextmanager
async def watching(cluster: CountingCluster, device_plugin: bool = True) -> AsyncIterator[Rig]:
    with fake_server(Recorder(), widgets(4)) as server:
        server.device_plugin = device_plugin
        resources: dict[str, Attached] = {WIDGET: attached(server, POOL)}
        watch = AllocationWatch(DRIVER, cluster, resources, structlog.get_logger("test"))
        claims = ClaimWatch(cluster, {"allocations": watch}, never, structlog.get_logger("test"))
        claims.start()
        try:
            yield Rig(watch, resources, server.table)
        finally:
            await claims.stop()
            await watch.stop()


def allocate(cluster: CountingCluster, name: str, *devices: str, pool: str = POOL) -> None:
    allocated = tuple(AllocatedDevice("req", DRIVER, pool, d) for d in devices)
    cluster.claims[("default", name)] = ClaimAllocation(f"uid-{name}", allocated)


async def test_an_allocated_claim_masks_its_devices_until_it_is_deallocated_or_deleted() -> None:
    cluster = CountingCluster()
    async with watching(cluster) as rig:
        allocate(cluster, "a", "w0", "w1")
        allocate(cluster, "other-pool", "w2", pool="node-b/widget")  # another node's: not ours
        await eventually(lambda: rig.masked() == {"w0", "w1"})
        assert rig.table.view().refusal(DEVICE_PLUGIN, ["w1"]) == "'w1' is held through DRA"
        allocate(cluster, "a", "w1")  # allocated anew (deallocated, then one device)
        await eventually(lambda: rig.masked() == {"w1"})
        cluster.claims[("default", "a")] = ClaimAllocation("uid-a", ())  # deallocated
        await eventually(lambda: not rig.masked())
        allocate(cluster, "b", "w3")
        await eventually(lambda: rig.masked() == {"w3"})
        del cluster.claims[("default", "b")]
        await eventually(lambda: not rig.masked())
        allocate(cluster, "c", "w2")
        await eventually(lambda: rig.masked() == {"w2"})
    assert rig.table.inventory.held(DRA) == frozenset()  # stopped: every claim let go


async def test_a_claim_deleted_while_the_watch_was_broken_is_let_go() -> None:
    cluster = CountingCluster()
    async with watching(cluster) as rig:
        allocate(cluster, "a", "w0")
        allocate(cluster, "b", "w1")
        await eventually(lambda: rig.masked() == {"w0", "w1"})
        cluster.down = "503 ServiceUnavailable"  # the watch breaks; started again after 1 s
        await asyncio.sleep(0.2)
        del cluster.claims[("default", "a")]  # no watch sees it go
        cluster.down = None
        async with asyncio.timeout(3):
            while rig.masked() != {"w1"}:  # read again once the watch started again
                await asyncio.sleep(0.05)


async def test_nothing_is_held_while_no_resource_is_served_through_both_apis() -> None:
    cluster = CountingCluster()
    async with watching(cluster, device_plugin=False) as rig:
        allocate(cluster, "a", "w0")
        await asyncio.sleep(0.2)
        assert (rig.watch.claims, rig.table.inventory.held(DRA)) == ({}, frozenset())
    with fake_server(Recorder(), widgets(1)) as dra_only:  # and what it sees is not held
        dra_only.device_plugin = False
        watch = AllocationWatch(DRIVER, cluster, {WIDGET: attached(dra_only, POOL)}, structlog.get_logger())
        watch.seen(("ADDED", await cluster.claim("default", "a")))
        assert (watch.claims, dra_only.table.inventory.held(DRA)) == ({}, frozenset())


async def test_a_resource_attached_later_holds_what_claims_were_allocated_of_it() -> None:
    cluster = CountingCluster()
    async with watching(cluster) as rig:
        allocate(cluster, "late", "v0", pool="node-a/valve")
        await eventually(lambda: ("default", "late") in rig.watch.claims)
        assert rig.watch.held == {}
        with fake_server(Recorder(), widgets(2, prefix="v"), resource="example.com/valve") as valve:
            rig.resources["example.com/valve"] = attached(valve, "node-a/valve")
            rig.watch.refresh()
            assert valve.table.view().masked(DEVICE_PLUGIN) == {"v0"}
