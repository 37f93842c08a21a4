"""One inventory across both APIs (``host/inventory.py`` through ``DeviceTable``): random holds and
releases on each side, on the devices the example backends and the port discover, never give a
device to two holders that exclude each other, never overdraw a counter, and each side's view
never offers what the inventory would refuse.

The device plugin side is driven as the kubelet drives it (it picks among the devices advertised
Healthy, any number, and does no counter math; Allocate's refusal stops it), DRA as the scheduler
does (it picks among the published devices, counting its own claims against the published counter
sets; a device that allows multiple allocations is shared).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devicehost import Device, Health, Resource, quantity
from devicehost.host import release
from devicehost.host.inventory import (
    DEVICE_PLUGIN,
    DRA,
    RELEASE,
    Inventory,
    amounts,
    consumed,
    overdrawn,
    plain,
)
from devicehost.host.release import ReleaseTracker
from devicehost.host.serving import wire
from devicehost.host.serving.table import DeviceTable
from devicehost_dra_example import DraExampleBackend, Settings
from devicehost_dra_example.net import DraExampleNetBackend, NetSettings
from devicehost_example import ExampleBackend, ExampleSettings


def example() -> Resource:
    backend = ExampleBackend()
    backend.devicehost_configure(ExampleSettings(resources={"example.com/widget": 6}, numa_nodes=2))
    return backend.devicehost_discover()[0]


def port(**values: object) -> Callable[[], Resource]:
    def discover() -> Resource:
        backend = DraExampleBackend()
        backend.devicehost_configure(Settings.model_validate({"node_name": "node-a", **values}))
        return backend.devicehost_discover()[0]

    return discover


def net() -> Resource:
    backend = DraExampleNetBackend()
    backend.devicehost_configure(NetSettings.model_validate({"node_name": "node-a", "num_nics": 3}))
    return backend.devicehost_discover()[0]


def mig() -> Resource:
    """A card cut into uneven slices of 7, as MIG profiles cut a GPU: its slices together can
    overdraw what one holder's slice leaves, though each alone fits."""
    sizes = {"1g": 1, "2g": 2, "3g": 3, "4g": 4, "7g": 7}
    devices = [
        Device(f"gpu-{n}-{name}-{k}", consumes={f"gpu-{n}": {"slices": size, "memory": f"{size * 10}Gi"}})
        for n in range(2)
        for name, size in sizes.items()
        for k in range(2 if size < 4 else 1)
    ]
    counters = {f"gpu-{n}": {"slices": 7, "memory": "70Gi"} for n in range(2)}
    return Resource("example.com/mig", tuple(devices), counter_sets=counters)


PROFILES = {
    "mig": mig,
    "example": example,
    "port": port(num_gpus=4),
    "port-partitionable": port(num_gpus=2, gpu_partitions=4),
    "port-partitionable-shared": port(num_gpus=1, gpu_partitions=2, gpu_allow_multiple_allocations=True),
    "port-shares": port(num_gpus=2, gpu_allow_multiple_allocations=True),
    "port-net": net,
}


class Node:
    """One resource served both ways: its table, the kubelet's pods and the scheduler's claims."""

    def __init__(self, resource: Resource) -> None:
        self.table = DeviceTable(resource.devices, resource.counter_sets)
        self.table.inventory.pods_followed = True
        self.devices = {d.id: d for d in resource.devices}
        self.pods: dict[str, tuple[str, ...]] = {}
        self.claims: dict[str, tuple[str, ...]] = {}
        self.now = 0.0
        self.refused = {DEVICE_PLUGIN: 0, DRA: 0}

    def healthy(self) -> list[str]:
        """What the kubelet may pick: advertised Healthy, not its own already."""
        held = {i for ids in self.pods.values() for i in ids}
        return [d.id for d in self.table.advertised() if d.health is Health.HEALTHY and d.id not in held]

    def published(self) -> list[str]:
        """What the scheduler may pick: the published devices."""
        masked = self.table.view().masked(DRA)
        return [i for i, d in self.devices.items() if i not in masked and d.health is Health.HEALTHY]

    def scheduler_allows(self, ids: tuple[str, ...]) -> bool:
        """Whether the scheduler would allocate ``ids`` to a new claim: free or shared devices,
        and its claims' consumption within the published counter sets."""
        whole = {i for c in self.claims.values() for i in c if not self.devices[i].allow_multiple_allocations}
        if whole & set(ids):
            return False
        mine = {i for c in self.claims.values() for i in c} | set(ids)
        left = amounts(self.table.view().counter_sets_left())
        return overdrawn(left, consumed(self.devices[i] for i in mine)) is None

    def allocate(self, pod: str, ids: tuple[str, ...]) -> None:
        """The kubelet's Allocate, as the servicer checks and holds it."""
        if self.table.view().refusal(DEVICE_PLUGIN, ids) is not None:
            self.refused[DEVICE_PLUGIN] += 1
            return
        with self.table.allocating(ids, self.now):
            self.pods[pod] = ids

    def look(self) -> None:
        """The release tracker's look at pod-resources."""
        self.now += 1
        self.table.follow_pods({i for ids in self.pods.values() for i in ids}, self.now, 10.0)

    def end_pod(self, pod: str) -> None:
        """A pod ends: its devices are released (the release hook holds them meanwhile)."""
        ids = self.pods.pop(pod)
        self.table.hold(RELEASE, DEVICE_PLUGIN, ids)
        self.look()
        self.table.hold(RELEASE, DEVICE_PLUGIN, ids, False)

    def prepare(self, claim: str, ids: tuple[str, ...]) -> None:
        """The kubelet prepares a claim the scheduler allocated."""
        problem = self.table.view().refusal(DRA, ids)
        assert problem is None, f"the scheduler picked from what was published, yet: {problem}"
        self.table.hold(f"claim {claim}", DRA, ids)
        self.claims[claim] = ids

    def unprepare(self, claim: str) -> None:
        self.table.hold(f"claim {claim}", DRA, self.claims.pop(claim), False)

    def check(self) -> None:
        """Nothing given out twice, no counter overdrawn, and each view offers only what is free."""
        inventory: Inventory = self.table.inventory
        dp, dra = inventory.held(DEVICE_PLUGIN), inventory.held(DRA)
        assert not dp & dra, f"held through both APIs: {sorted(dp & dra)}"
        total = amounts(self.table.counter_sets)
        used = consumed(self.devices[i] for i in dp | dra)
        assert overdrawn(total, used) is None, (total, used)
        view = self.table.view()
        for device_id in self.healthy():
            assert view.refusal(DEVICE_PLUGIN, [device_id]) is None, device_id
        for device_id in self.published():
            if self.scheduler_allows((device_id,)):
                assert view.refusal(DRA, [device_id]) is None, device_id
        left = amounts(view.counter_sets_left())
        assert all(v >= Decimal(0) for v in left.values())


@pytest.mark.parametrize("profile", sorted(PROFILES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_holds_through_both_apis_never_give_anything_twice(profile: str, data: st.DataObject) -> None:
    node = Node(PROFILES[profile]())
    for step in range(data.draw(st.integers(5, 40), label="steps")):
        action = data.draw(st.sampled_from(["allocate", "end_pod", "prepare", "unprepare", "look"]))
        if action == "allocate" and node.healthy():
            ids = data.draw(st.lists(st.sampled_from(node.healthy()), min_size=1, max_size=3, unique=True))
            node.allocate(f"pod-{step}", tuple(ids))
        elif action == "end_pod" and node.pods:
            node.end_pod(data.draw(st.sampled_from(sorted(node.pods))))
        elif action == "prepare" and node.published():
            ids = tuple(
                data.draw(st.lists(st.sampled_from(node.published()), min_size=1, max_size=3, unique=True))
            )
            if node.scheduler_allows(ids):
                node.prepare(f"claim-{step}", ids)
        elif action == "unprepare" and node.claims:
            node.unprepare(data.draw(st.sampled_from(sorted(node.claims))))
        elif action == "look":
            node.look()
        node.check()
    for claim in list(node.claims):
        node.unprepare(claim)
    for pod in list(node.pods):
        node.end_pod(pod)
    node.now += 10  # what Allocate gave out and no look listed is held until the grace ends
    node.look()
    assert node.table.inventory.held() == frozenset()
    assert node.table.view().masked(DEVICE_PLUGIN) == node.table.view().masked(DRA) == frozenset()


def test_a_card_held_whole_masks_its_partitions_and_a_partition_masks_the_card() -> None:
    counters = {"x1-0": {"memory": "32Gi"}}
    card = Device("x1-0", consumes={"x1-0": {"memory": "32Gi"}})
    parts = [Device(f"x1-0-p{n}", consumes={"x1-0": {"memory": "8Gi"}}) for n in range(4)]
    table = DeviceTable([card, *parts], counters)
    table.hold("claim a", DRA, ["x1-0"])
    assert table.view().masked(DEVICE_PLUGIN) == {"x1-0", *(d.id for d in parts)}
    assert table.view().masked(DRA) == frozenset()  # the scheduler counts its own claim
    table.hold("claim a", DRA, ["x1-0"], False)
    table.hold("pods", DEVICE_PLUGIN, ["x1-0-p2"])
    assert table.view().masked(DRA) == {"x1-0", "x1-0-p2"}
    assert table.view().masked(DEVICE_PLUGIN) == {"x1-0"}
    assert table.view().counter_sets_left() == {"x1-0": {"memory": "24Gi"}}
    assert table.view().refusal(DRA, ["x1-0-p0", "x1-0-p1", "x1-0-p3"]) is None
    assert table.view().refusal(DRA, ["x1-0-p2"]) == "'x1-0-p2' is held through the device plugin API"


def test_a_shared_device_any_claim_holds_is_masked_for_the_device_plugin_api() -> None:
    table = DeviceTable([Device("nic-0", allow_multiple_allocations=True), Device("nic-1")])
    table.hold("claim a", DRA, ["nic-0"])
    table.hold("claim b", DRA, ["nic-0"])  # a second share
    table.hold("claim a", DRA, ["nic-0"], False)
    assert table.view().masked(DEVICE_PLUGIN) == {"nic-0"}  # claim b's share still holds it
    assert table.view().refusal(DEVICE_PLUGIN, ["nic-0"]) == "'nic-0' is held through DRA"
    assert [d.health for d in table.advertised()] == [Health.UNHEALTHY, Health.HEALTHY]


def test_a_hold_bumps_the_version_once_and_a_repeat_not_at_all() -> None:
    table = DeviceTable([Device("a"), Device("b")])
    version = table.version
    table.hold("claims", DRA, ["a"])
    table.hold("claims", DRA, ["a"])
    assert table.version == version + 1
    table.follow_pods(["b"], now=0.0, grace=10.0)
    table.follow_pods(["b"], now=1.0, grace=10.0)
    assert table.version == version + 2


def test_an_allocation_is_held_until_listed_or_the_grace_ends() -> None:
    table = DeviceTable([Device("a"), Device("b"), Device("c")])
    with table.allocating(["a"], now=0.0):
        assert table.inventory.held() == frozenset()  # pod-resources not followed: nothing to end it
    table.inventory.pods_followed = True
    with table.allocating(["a"], now=0.0):
        pass
    with table.allocating(["b"], now=5.0):
        pass
    held_meanwhile: list[frozenset[str]] = []

    def failing_hook() -> None:
        with table.allocating(["c"], now=5.0):
            held_meanwhile.append(table.inventory.of("allocated"))
            raise RuntimeError("the allocate hook failed")

    with pytest.raises(RuntimeError):
        failing_hook()
    assert held_meanwhile == [{"a", "b", "c"}]  # held while its hooks ran, given back after
    table.follow_pods(["a"], now=6.0, grace=10.0)  # a listed: held as the pods'
    assert table.inventory.holders() == {
        "pods": ("device-plugin", {"a"}),
        "allocated": ("device-plugin", {"b"}),
    }
    table.follow_pods(["a"], now=16.0, grace=10.0)  # b never listed within the grace
    assert table.inventory.holders() == {"pods": ("device-plugin", {"a"})}


def test_a_hold_only_dra_sees_leaves_the_device_plugin_message_as_built() -> None:
    table = DeviceTable([Device("a"), Device("b")])
    table.inventory.pods_followed = True
    built = table.message()
    version = table.version
    with table.allocating(["a"], now=0.0):
        pass
    assert table.view().masked(DRA) == {"a"}  # withdrawn from the slices: the DRA side follows
    assert table.version == version + 1
    assert table.message() is built  # the kubelet's streams send nothing new


def test_a_device_that_overdraws_alone_is_the_backends_mistake_not_a_hold() -> None:
    counters = {"gpu-0": {"memory": "16Gi"}}
    small = Device("p0", consumes={"gpu-0": {"memory": "8Gi"}})
    big = Device("p1", consumes={"gpu-0": {"memory": "20Gi"}})  # conformance's dra-counters names it
    table = DeviceTable([small, big], counters)
    table.hold("pods", DEVICE_PLUGIN, ["p0"])
    view = table.view()
    assert view.masked(DRA) == {"p0"}  # p1 stays as the backend declared it
    assert view.refusal(DEVICE_PLUGIN, ["p1"]) is None
    assert view.counter_sets_left() == {"gpu-0": {"memory": "8Gi"}}


async def test_a_look_without_an_answer_keeps_the_holds_and_lets_unlisted_allocations_go(
    tmp_path: Path,
) -> None:
    table = DeviceTable([Device("a"), Device("b")])
    table.inventory.pods_followed = True
    served = SimpleNamespace(table=table)  # what the tracker reads of a served resource
    tracker = ReleaseTracker(tmp_path / "no-such.sock", tmp_path, 1.0, lambda: {"r": served})  # type: ignore[dict-item]
    with table.allocating(["a"], now=time.monotonic() - 2 * release.ALLOCATED_GRACE):
        pass
    with table.allocating(["b"], now=time.monotonic()):
        pass
    await tracker.look()
    assert tracker.status.startswith("paused")
    assert table.inventory.holders() == {"allocated": ("device-plugin", {"b"})}


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (Decimal(24 * 2**30), "24Gi"),
        (Decimal(75), "75"),
        (Decimal(1000), "1000"),
        (Decimal("0.5"), "0.5"),
        (Decimal(0), "0"),
    ],
)
def test_amounts_are_written_as_quantities_a_person_reads(amount: Decimal, text: str) -> None:
    assert plain(amount) == text
    assert quantity.parse(text) == amount


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_message_with_holds_is_what_a_full_rebuild_of_the_advertised_list_gives(
    data: st.DataObject,
) -> None:
    counters = {"card": {"slices": 4}}
    devices = [Device("card", consumes={"card": {"slices": 4}})] + [
        Device(f"part-{n}", consumes={"card": {"slices": 1}}) for n in range(4)
    ]
    table = DeviceTable(devices, counters)
    ids = [d.id for d in devices]
    for _ in range(data.draw(st.integers(1, 12))):
        table.message()  # built, so the next health change patches it
        action = data.draw(st.sampled_from(["health", "hold", "release", "pods"]))
        chosen = data.draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))
        if action == "health":
            table.set_health({i: data.draw(st.sampled_from(list(Health))) for i in chosen})
        elif action == "hold":
            table.hold("claims", DRA, chosen, data.draw(st.booleans()))
        elif action == "release":
            table.hold(RELEASE, DEVICE_PLUGIN, chosen, data.draw(st.booleans()))
        else:
            table.follow_pods(chosen, now=0.0, grace=10.0)
        assert table.message() == wire.device_list(table.advertised())
