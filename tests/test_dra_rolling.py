"""Two hosts serving one DRA driver on one node, as during a rolling update of the DaemonSet.

Both run in one dir against one API server: either prepares or unprepares any claim, the claims
checkpoint ends with each claim once, and the one that stops leaves the other's slices alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from drafakes import CountingCluster, dra_host, dra_root
from slicewatch import Timeline, Window, longest, missing, noted_kubelet, unregistered
from waiting import eventually

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.daemon import Host
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint, unprepare

DRIVER = "example.org"
SLICE = "n-example.org-gpu"


class Gpus:
    """example.org/gpu with ``count`` devices; records what it allocates and releases."""

    def __init__(self, count: int = 8) -> None:
        self.count = count
        self.allocated: list[tuple[str, ...]] = []
        self.released: list[tuple[str, ...]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource("example.org/gpu", tuple(Device(f"gpu{n}") for n in range(self.count)))]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        self.allocated.append(device_ids)
        return ContainerAllocation(envs={"GPUS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        self.released.append(device_ids)


@pytest.fixture
def root() -> Iterator[Path]:
    with dra_root("drr-") as made:
        yield made


def host_of(root: Path, backend: Gpus, cluster: ClusterStandIn) -> AbstractAsyncContextManager[Host]:
    """One instance; the test registers it (:func:`endpoint`) or runs the kubelet stand-in."""
    return dra_host(root, {"gpus": backend}, cluster, "n", kubelet=False, rediscover_interval=0.05)


async def endpoint(root: Path, host: Host) -> str:
    """The host's DRA socket, read from its own registration socket as the kubelet reads it."""
    socket = root / "registry" / f"devicehost-{DRIVER}-{host.token}.sock"
    async with asyncio.timeout(5):
        while not socket.exists():
            await asyncio.sleep(0.01)
    return (await registered_endpoint(socket)).endpoint


def claim(cluster: ClusterStandIn, device: str) -> tuple[str, str, str]:
    """A claim of one GPU, allocated as the scheduler would."""
    uid = f"uid-{len(cluster.claims)}"
    cluster.claims[("default", uid)] = ClaimAllocation(
        uid, (AllocatedDevice("gpu", DRIVER, "n/gpu", device),)
    )
    return "default", uid, uid


def checkpointed(root: Path) -> list[str]:
    """The claim UIDs in the driver's checkpoint file."""
    raw = json.loads((root / "plugins" / DRIVER / "devicehost-claims.json").read_text())
    return sorted(raw["claims"])


async def test_a_claim_prepared_by_one_host_is_unprepared_by_the_other(root: Path) -> None:
    old, new, cluster = Gpus(), Gpus(), ClusterStandIn()
    async with host_of(root, old, cluster) as a, host_of(root, new, cluster) as b:
        at_a, at_b = await endpoint(root, a), await endpoint(root, b)
        assert at_a != at_b  # each instance has its own DRAPlugin socket
        ref = claim(cluster, "gpu3")
        first = (await prepare(at_a, [ref])).claims[ref[1]]
        assert first.error == ""
        again = (await prepare(at_b, [ref])).claims[ref[1]]
        assert again == first  # the other instance answers what the first did, without allocating
        assert (old.allocated, new.allocated) == ([("gpu3",)], [])
        assert (await unprepare(at_b, [ref])).claims[ref[1]].error == ""
        assert (old.released, new.released) == ([], [("gpu3",)])
        assert checkpointed(root) == []
        assert not list((root / "cdi").glob(f"*claim-{ref[1]}*"))
        assert (await unprepare(at_a, [ref])).claims[ref[1]].error == ""  # the old one, late: done already
        assert old.released == []


async def test_with_both_serving_each_claim_is_checkpointed_once(root: Path) -> None:
    old, new, cluster = Gpus(count=40), Gpus(count=40), ClusterStandIn()
    async with host_of(root, old, cluster) as a, host_of(root, new, cluster) as b:
        ends = [await endpoint(root, a), await endpoint(root, b)]
        refs = [claim(cluster, f"gpu{n}") for n in range(40)]
        calls = [prepare(ends[n % 2], [ref]) for n, ref in enumerate(refs)]
        calls += [prepare(ends[(n + 1) % 2], [ref]) for n, ref in enumerate(refs[:10])]  # asked of both
        answers = await asyncio.gather(*calls)
        assert [a.claims[ref[1]].error for a, ref in zip(answers, refs, strict=False)] == [""] * 40
        assert checkpointed(root) == sorted(ref[1] for ref in refs)  # none lost
        assert sorted(old.allocated + new.allocated) == sorted((f"gpu{n}",) for n in range(40))  # none twice
        undone = await asyncio.gather(*(unprepare(ends[(n + 1) % 2], [ref]) for n, ref in enumerate(refs)))
        assert all(u.claims[ref[1]].error == "" for u, ref in zip(undone, refs, strict=True))
        assert checkpointed(root) == []
        assert sorted(old.released + new.released) == sorted((f"gpu{n}",) for n in range(40))


class SlowStart(CountingCluster):
    """The API server, answering the taints question (a new driver's first call) only once
    ``answering`` is set: the kubelet registers a starting host before it knows its pools."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = asyncio.Event()
        self.answering.set()

    async def device_taints(self, node: str, driver: str) -> bool:
        await self.answering.wait()
        return await super().device_taints(node, driver)


async def test_the_host_that_stops_leaves_the_slices_the_other_publishes(root: Path) -> None:
    cluster = SlowStart()
    async with contextlib.AsyncExitStack() as older:
        a = await older.enter_async_context(host_of(root, Gpus(), cluster))
        await endpoint(root, a)
        await cluster.wait(lambda c: SLICE in c.stored)
        published = dict(cluster.calls)
        cluster.answering.clear()
        async with host_of(root, Gpus(), cluster) as b:
            await endpoint(root, b)  # registered, its pool not known yet
            await asyncio.sleep(0.2)
            cluster.answering.set()
            await asyncio.sleep(0.3)  # the newer one has compared what it wants with what is published
            assert cluster.calls["delete_slice"] == published.get("delete_slice", 0) == 0
            assert cluster.calls["create_slice"] == published["create_slice"]  # the same pool, kept
            await older.aclose()  # the older host stops while the newer serves
            assert cluster.calls["delete_slice"] == 0
            assert SLICE in cluster.stored
        await cluster.wait(lambda c: SLICE not in c.stored)  # the last one to go withdraws them


async def test_a_dead_instances_socket_or_another_drivers_does_not_keep_the_slices(root: Path) -> None:
    cluster = CountingCluster()
    with (
        socket.socket(socket.AF_UNIX) as dead,
        socket.socket(socket.AF_UNIX) as other_driver,
    ):
        dead.bind(str(root / "registry" / f"devicehost-{DRIVER}-0abcde.sock"))  # bound, never listening
        other_driver.bind(str(root / "registry" / "devicehost-other.org-0abcde.sock"))
        other_driver.listen()
        async with host_of(root, Gpus(), cluster) as a:
            await endpoint(root, a)
            await cluster.wait(lambda c: SLICE in c.stored)
        assert SLICE not in cluster.stored
        assert cluster.calls["delete_slice"] == 1


async def started(host: AbstractAsyncContextManager[Host]) -> contextlib.AsyncExitStack:
    """``host`` entered, in a stack that stops it when closed."""
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(host)
    return stack


async def test_rollouts_never_leave_the_pool_missing_nor_published_unregistered(root: Path) -> None:
    """Three rollouts in a row, as the DaemonSet's surge does them: the newer instance starts
    beside the older, the kubelet registers it, the older stops."""
    cluster = Timeline(DRIVER)
    async with noted_kubelet(root, cluster) as kubelet:
        window = Window(cluster, kubelet, DRIVER)
        serving = await started(host_of(root, Gpus(), cluster))
        await cluster.wait(lambda c: SLICE in c.stored)
        for _ in range(3):
            newer = await started(host_of(root, Gpus(), cluster))
            await eventually(lambda: len(kubelet.dra.endpoints(DRIVER)) == 2, "the newer one registered")
            await asyncio.sleep(0.1)  # the newer one has compared what it wants with what is published
            await serving.aclose()  # the older stops while the newer serves
            serving = newer
            await asyncio.sleep(0.1)
        await serving.aclose()
        await window.stop()
    states = sorted(window.samples + cluster.changes)
    gap = longest([s for s in states if s[0] < cluster.changes[-1][0]], missing)  # up to the last stop
    assert gap == 0.0  # every change of the API server noted: the pool was never missing
    assert longest(states, unregistered) == 0.0
    assert SLICE not in cluster.stored  # the last one withdrew them
    assert len(cluster.changes) == 2  # created once, deleted once: no instance rewrote the other's
    print(f"rollouts: longest gap in the pool {gap:.3f} s over {len(window.samples)} samples")


async def test_the_older_instance_leaves_the_newer_ones_pool_as_the_newer_publishes_it(root: Path) -> None:
    """A new version that publishes the pool otherwise (here a ninth device): the newer instance
    writes its pool once, the older does not write its own back for as long as both run."""
    cluster = Timeline(DRIVER)
    async with noted_kubelet(root, cluster) as kubelet, host_of(root, Gpus(8), cluster):
        await cluster.wait(lambda c: len(c.devices(DRIVER)) == 8)
        async with host_of(root, Gpus(9), cluster):
            await eventually(lambda: len(kubelet.dra.endpoints(DRIVER)) == 2, "the newer one registered")
            await cluster.wait(lambda c: len(c.devices(DRIVER)) == 9)
            written = len(cluster.changes)
            await asyncio.sleep(2.5)  # more than two of the pool's write intervals
            assert len(cluster.changes) == written
            assert len(cluster.devices(DRIVER)) == 9
