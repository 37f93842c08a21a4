"""Pools of any size: a resource's devices over as many slices as they need, one pool, with a
slice count and generation the scheduler can trust after every single write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from drafakes import CountingCluster
from hostfakes import captured_logs

from devicehost import Device, Health
from devicehost.host.dra import names
from devicehost.host.dra.publisher import Publisher
from devicehost.host.dra.slices import MAX_DEVICES, Placement, pool_specs, slice_body
from devicehost.testing.cluster import NODE_UID

NODE, DRIVER, RESOURCE, POOL = "node-a", "example.com", "example.com/widget", "node-a/widget"


def devices(count: int, start: int = 0, **health: Health) -> list[Device]:
    return [Device(f"w{n}", health.get(f"w{n}", Health.HEALTHY)) for n in range(start, start + count)]


def slice_names(count: int) -> list[str]:
    return [names.slice_name(NODE, DRIVER, RESOURCE, i) for i in range(count)]


class SchedulerView(CountingCluster):
    """The in-memory API server, looking at the pools after every write as the scheduler does:
    only the newest generation of a pool counts, and the pool only once it has as many slices of
    that generation as they say. ``views`` holds each complete pool's devices after each write;
    a pool whose newest slices disagree on the count, or that names a device twice, fails."""

    def __init__(self) -> None:
        super().__init__()
        self.views: list[frozenset[str]] = []

    def _bump(self) -> None:
        super()._bump()
        newest: dict[str, int] = {}
        for body in self.stored.values():
            pool = body["spec"]["pool"]
            newest[pool["name"]] = max(newest.get(pool["name"], 0), pool["generation"])
        for name, generation in newest.items():
            current = [
                b["spec"]
                for b in self.stored.values()
                if b["spec"]["pool"]["name"] == name and b["spec"]["pool"]["generation"] == generation
            ]
            counts = {s["pool"]["resourceSliceCount"] for s in current}
            assert len(counts) == 1, f"slices of {name} at generation {generation} disagree: {counts}"
            if counts == {len(current)}:
                listed = [d["name"] for s in current for d in s["devices"]]
                assert len(listed) == len(set(listed)), f"a device twice in {name}"
                self.views.append(frozenset(listed))


def want(publisher: Publisher, placement: Placement, table: Sequence[Device]) -> None:
    specs = pool_specs(NODE, DRIVER, POOL, table, placement)
    publisher.want_pool(RESOURCE, list(zip(slice_names(len(specs)), specs, strict=True)))


def healthy(table: Sequence[Device]) -> frozenset[str]:
    return frozenset(d.id for d in table if d.health is Health.HEALTHY)


def pools(cluster: CountingCluster) -> list[Mapping[str, Any]]:
    return [b["spec"]["pool"] for b in cluster.stored.values()]


def versions(cluster: CountingCluster) -> dict[str, str]:
    return {n: b["metadata"]["resourceVersion"] for n, b in cluster.stored.items()}


async def published(count: int) -> tuple[SchedulerView, Publisher, Placement, list[Device]]:
    cluster, placement, table = SchedulerView(), Placement(), devices(count)
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, placement, table)
    await publisher.sync()
    return cluster, publisher, placement, table


# -- placement -----------------------------------------------------------------------------------


def test_devices_fill_slices_of_128_in_order() -> None:
    slices = Placement().place([d.id for d in devices(1000)])
    assert [len(s) for s in slices] == [128] * 7 + [104]
    assert slices[4][0] == "w512"
    assert Placement().place([]) == [[]]  # a pool has one slice, empty or not


def test_a_device_keeps_its_slice_while_it_exists() -> None:
    placement = Placement(per_slice=4)
    first = placement.place([f"d{n}" for n in range(10)])
    assert first == [["d0", "d1", "d2", "d3"], ["d4", "d5", "d6", "d7"], ["d8", "d9"]]
    gone = placement.place([f"d{n}" for n in range(10) if n != 5])
    assert gone == [["d0", "d1", "d2", "d3"], ["d4", "d6", "d7"], ["d8", "d9"]]
    back = placement.place(["new", *(f"d{n}" for n in range(10) if n != 5)])  # first slice with room
    assert back == [["d0", "d1", "d2", "d3"], ["new", "d4", "d6", "d7"], ["d8", "d9"]]


def test_a_pool_that_needs_fewer_slices_moves_only_the_devices_of_the_slices_that_go() -> None:
    placement = Placement(per_slice=4)
    placement.place([f"d{n}" for n in range(12)])
    left = ["d0", "d1", "d4", "d8", "d9", "d10", "d11"]  # 7 devices: 2 slices will do
    assert placement.place(left) == [["d0", "d1", "d8", "d9"], ["d4", "d10", "d11"]]


def test_slice_names_keep_the_first_and_number_the_others() -> None:
    assert slice_names(3) == [
        "node-a-example.com-widget",  # the name a one-slice pool always had
        "node-a-example.com-widget-1",
        "node-a-example.com-widget-2",
    ]
    long = names.slice_name("n" * 300, DRIVER, RESOURCE, 12)
    assert len(long) == 253
    assert long.endswith("-12")
    assert long != names.slice_name("n" * 300, DRIVER, RESOURCE, 1)


# -- publishing ----------------------------------------------------------------------------------


async def test_1000_devices_are_one_pool_of_8_slices_of_one_generation() -> None:
    cluster, publisher, _, table = await published(1000)
    assert sorted(cluster.stored) == sorted(slice_names(8))
    assert all(pool == {"name": POOL, "generation": 1, "resourceSliceCount": 8} for pool in pools(cluster))
    assert [len(cluster.stored[n]["spec"]["devices"]) for n in slice_names(8)] == [128] * 7 + [104]
    assert all(b["metadata"]["ownerReferences"][0]["uid"] == NODE_UID for b in cluster.stored.values())
    assert publisher.written.writes == cluster.calls["create_slice"] == 8
    assert cluster.views[-1] == healthy(table)
    assert cluster.views == [healthy(table)]  # never complete before the last slice


async def test_a_device_flapping_rewrites_its_own_slice_and_keeps_the_generation() -> None:
    cluster, publisher, placement, table = await published(1000)
    before = versions(cluster)
    sick = [Device(d.id, Health.UNHEALTHY) if d.id == "w600" else d for d in table]  # in the 5th slice
    want(publisher, placement, sick)
    await publisher.sync()
    assert publisher.written.writes == 8 + 1
    assert {n for n, v in versions(cluster).items() if before[n] != v} == {slice_names(8)[4]}
    assert {p["generation"] for p in pools(cluster)} == {1}  # one whole-slice write: no mix to hide
    assert cluster.views[-1] == healthy(table) - {"w600"}
    want(publisher, placement, table)
    await publisher.sync()
    assert publisher.written.writes == 8 + 2
    assert cluster.views[-1] == healthy(table)
    await publisher.sync()  # nothing changed: nothing written
    assert publisher.written.writes == 8 + 2


async def test_a_change_of_two_slices_moves_the_generation_of_every_slice() -> None:
    cluster, publisher, placement, table = await published(1000)
    sick = [Device(d.id, Health.UNHEALTHY) if d.id in ("w0", "w999") else d for d in table]
    want(publisher, placement, sick)
    await publisher.sync()
    assert publisher.written.writes == 8 + 8
    assert {p["generation"] for p in pools(cluster)} == {2}
    assert set(cluster.views) == {healthy(table), healthy(table) - {"w0", "w999"}}  # never a mix


async def test_a_pool_that_grows_gets_a_new_slice_and_a_new_generation() -> None:
    cluster, publisher, placement, table = await published(1000)
    grown = table + devices(100, start=1000)
    want(publisher, placement, grown)
    await publisher.sync()
    assert sorted(cluster.stored) == sorted(slice_names(9))
    assert all(p == {"name": POOL, "generation": 2, "resourceSliceCount": 9} for p in pools(cluster))
    assert (cluster.calls["replace_slice"], cluster.calls["create_slice"]) == (8, 8 + 1)
    assert set(cluster.views) == {healthy(table), healthy(grown)}


async def test_a_pool_that_shrinks_deletes_its_extra_slices_first() -> None:
    cluster, publisher, placement, table = await published(1000)
    want(publisher, placement, table[:300])
    await publisher.sync()
    assert sorted(cluster.stored) == sorted(slice_names(3))
    assert all(p == {"name": POOL, "generation": 2, "resourceSliceCount": 3} for p in pools(cluster))
    assert (cluster.calls["delete_slice"], cluster.calls["replace_slice"]) == (5, 3)
    assert set(cluster.views) == {healthy(table), healthy(table[:300])}


async def test_a_slice_deleted_by_someone_else_comes_back_with_the_whole_pool_newer() -> None:
    cluster, publisher, _, table = await published(1000)
    cluster.delete(slice_names(8)[3])
    await publisher.sync()
    assert len(cluster.stored) == 8
    assert {p["generation"] for p in pools(cluster)} == {2}
    assert set(cluster.views) == {healthy(table)}


async def test_slices_left_by_an_earlier_start_are_taken_over_above_their_generation() -> None:
    cluster = SchedulerView()
    left = devices(10 * MAX_DEVICES)
    for i, spec in enumerate(pool_specs(NODE, DRIVER, POOL, left, Placement())):
        spec["pool"]["generation"] = 5
        await cluster.create_slice(
            slice_body(names.slice_name(NODE, DRIVER, RESOURCE, i), (NODE, NODE_UID), spec)
        )
    publisher, placement, table = Publisher(cluster, NODE, DRIVER), Placement(), devices(1000)
    want(publisher, placement, table)
    await publisher.sync()
    assert sorted(cluster.stored) == sorted(slice_names(8))
    assert all(p == {"name": POOL, "generation": 6, "resourceSliceCount": 8} for p in pools(cluster))
    assert cluster.calls["delete_slice"] == 2
    assert cluster.views[-1] == healthy(table)


async def test_a_dropped_pool_is_deleted_whole() -> None:
    cluster, publisher, _, _ = await published(1000)
    publisher.drop_pool(RESOURCE)
    await publisher.sync()
    assert cluster.stored == {}
    assert cluster.calls["delete_slice"] == 8


async def test_a_slice_name_of_another_pool_is_refused() -> None:
    with captured_logs() as logs:
        cluster, publisher, _, _ = await published(200)  # widget, widget-1
        other = pool_specs(NODE, DRIVER, "node-a/widget-1", devices(1), Placement())
        clashing = names.slice_name(NODE, DRIVER, "example.com/widget-1")
        publisher.want_pool("example.com/widget-1", [(clashing, other[0])])
        await publisher.sync()
    assert clashing == slice_names(2)[1]
    assert [e["slices"] for e in logs if e["event"].startswith("ResourceSlice names taken")] == [[clashing]]
    assert cluster.stored[clashing]["spec"]["pool"]["name"] == POOL  # the first pool's, left alone


@pytest.mark.parametrize("count", [0, 1, 128, 129, 256, 257])
async def test_every_size_is_one_complete_pool(count: int) -> None:
    cluster, _, _, table = await published(count)
    expected = max(1, -(-count // MAX_DEVICES))
    assert len(cluster.stored) == expected
    assert all(p["resourceSliceCount"] == expected for p in pools(cluster))
    assert cluster.views[-1] == healthy(table)
