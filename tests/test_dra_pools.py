"""A resource of 1,000 devices through DRA on the real host: one pool of 8 slices, a device
flapping rewrites its own slice, rediscovery writes nothing, a shrink deletes the extra slices,
and a claim on a device of the 5th slice prepares."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from benchmarking import minimal_run
from drafakes import CountingCluster, dra_host, dra_root

import devicehost
from devicehost import ContainerAllocation, Device, Health, Resource
from devicehost.host.daemon import Host
from devicehost.host.dra import names
from devicehost.testing.cluster import prepare, registered_endpoint, unprepare

DRIVER, RESOURCE, NODE, POOL = "example.org", "example.org/gpu", "n", "n/gpu"


class Many:
    """One resource of ``count`` devices ``g0``..., their health in ``health``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.health: dict[str, Health] = {}
        self.discoveries = 0

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        self.discoveries += 1
        ids = (f"g{n}" for n in range(self.count))
        return [Resource(RESOURCE, tuple(Device(i, self.health.get(i, Health.HEALTHY)) for i in ids))]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})


@pytest.fixture
def root() -> Iterator[Path]:
    with dra_root("drp-") as made:
        yield made


def host_of(root: Path, backend: Many, cluster: CountingCluster) -> AbstractAsyncContextManager[Host]:
    return dra_host(root, {"many": backend}, cluster, NODE, rediscover_interval=0.05)


def slice_names(count: int) -> list[str]:
    return [names.slice_name(NODE, DRIVER, RESOURCE, i) for i in range(count)]


def pool_of(cluster: CountingCluster, slices: int, devices: int) -> bool:
    """The pool is published whole: ``slices`` slices of one generation with ``devices`` devices."""
    bodies = [b["spec"] for b in cluster.stored.values()]
    return (
        sorted(cluster.stored) == sorted(slice_names(slices))
        and len({(s["pool"]["generation"], s["pool"]["resourceSliceCount"]) for s in bodies}) == 1
        and bodies[0]["pool"]["resourceSliceCount"] == slices
        and sum(len(s["devices"]) for s in bodies) == devices
    )


def writes(cluster: CountingCluster) -> int:
    return sum(cluster.calls[c] for c in ("create_slice", "replace_slice", "delete_slice"))


async def test_a_thousand_devices_are_one_pool_of_eight_slices(root: Path) -> None:
    backend, cluster = Many(1000), CountingCluster()
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: pool_of(c, 8, 1000))
        assert {b["spec"]["pool"]["name"] for b in cluster.stored.values()} == {POOL}
        assert {b["spec"]["pool"]["generation"] for b in cluster.stored.values()} == {1}
        assert writes(cluster) == 8
        fifth = cluster.stored[slice_names(8)[4]]["spec"]["devices"]
        assert [d["name"] for d in fifth][:2] == ["g512", "g513"]

        (socket,) = (root / "registry").glob(f"devicehost-{DRIVER}-*.sock")
        endpoint = (await registered_endpoint(socket)).endpoint
        claim = cluster.allocate(DRIVER, devices=["g600"])
        answer = (await prepare(endpoint, [claim])).claims[claim[1]]
        assert answer.error == ""
        assert [(d.pool_name, d.device_name) for d in answer.devices] == [(POOL, "g600")]
        assert (await unprepare(endpoint, [claim])).claims[claim[1]].error == ""

        versions = {n: b["metadata"]["resourceVersion"] for n, b in cluster.stored.items()}
        backend.health["g600"] = Health.UNHEALTHY
        await cluster.wait(lambda c: pool_of(c, 8, 999))
        assert writes(cluster) == 8 + 1  # the 5th slice only, the generation kept
        changed = {n for n, b in cluster.stored.items() if b["metadata"]["resourceVersion"] != versions[n]}
        assert changed == {slice_names(8)[4]}
        assert {b["spec"]["pool"]["generation"] for b in cluster.stored.values()} == {1}
        del backend.health["g600"]
        await cluster.wait(lambda c: pool_of(c, 8, 1000))
        assert writes(cluster) == 8 + 2

        backend.count = 200
        await cluster.wait(lambda c: pool_of(c, 2, 200))
        assert {b["spec"]["pool"]["generation"] for b in cluster.stored.values()} == {2}
        assert cluster.calls["delete_slice"] == 6
    assert cluster.stored == {}  # withdrawn when the host stops


async def test_rediscovery_with_nothing_changed_writes_nothing(root: Path) -> None:
    backend, cluster = Many(1000), CountingCluster()
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: pool_of(c, 8, 1000))
        seen = backend.discoveries
        async with asyncio.timeout(10):
            while backend.discoveries < seen + 10:  # every 50 ms
                await asyncio.sleep(0.05)
        assert writes(cluster) == 8


def test_the_publish_benchmark_reports_the_writes(tmp_path: Path) -> None:
    figures = {f["name"]: f for f in minimal_run(tmp_path, "dra_publish")["figures"]}
    writes = {name: (f["value"], f["baseline"]) for name, f in figures.items() if f["unit"] == "writes"}
    assert writes == {
        "API writes, first publish (8 slices)": (8, 8),
        "API writes, one device unhealthy and back 10 times": (20, 160),  # bare: every slice each time
        "API writes, rediscovery with nothing changed": (0, 0),
    }
    (rate,) = [f for f in figures.values() if f["unit"] == "writes/min"]
    assert rate["value"] <= 66 < rate["baseline"]  # a slice written once a second, not on every change
    for figure in figures.values():
        assert math.isfinite(figure["value"])
        assert figure["value"] >= 0
