"""The stand-in's allocator: the scheduler's rules for one claim at a time, on hand-made slices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devicehost.resourceapi import AllocatedDevice, ClaimAllocation, OpaqueConfig
from devicehost.standin.allocator import (
    CANNOT_ALLOCATE,
    Allocation,
    Unschedulable,
    allocate,
    allocate_together,
)
from devicehost.standin.scheduling import driver_class

DRIVER = "gpu.example.com"


def gpu(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "index": {"int": index},
            "model": {"string": "LATEST-GPU-MODEL"},
            **extra.pop("attrs", {}),
        },
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def slice_of(
    devices: Sequence[Mapping[str, Any]],
    *,
    name: str = "node-a-gpu",
    pool: str = "node-a",
    generation: int = 1,
    counters: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": "node-a",
        "pool": {"name": pool, "generation": generation},
    }
    if devices:
        spec["devices"] = list(devices)
    if counters:
        spec["sharedCounters"] = [
            {"name": n, "counters": {k: {"value": v} for k, v in c.items()}} for n, c in counters.items()
        ]
    return {"metadata": {"name": name}, "spec": spec}


def exactly(name: str = "gpu", **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **body}}


def claim(*requests: Mapping[str, Any], **devices: Any) -> dict[str, Any]:
    return {"devices": {"requests": list(requests), **devices}}


def cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


@dataclass
class Scene:
    """Slices, classes and the claims allocated so far, one after the other."""

    slices: list[dict[str, Any]]
    classes: dict[str, Any] = field(default_factory=lambda: {DRIVER: driver_class(DRIVER)})
    rules: list[dict[str, Any]] = field(default_factory=list)
    held: list[ClaimAllocation] = field(default_factory=list)

    def take(self, spec: Mapping[str, Any]) -> Allocation:
        found = allocate(
            spec, slices=self.slices, classes=self.classes, claims=self.held, taint_rules=self.rules
        )
        self.held.append(ClaimAllocation(f"uid-{len(self.held)}", found.devices, found.configs))
        return found

    def refused(self, spec: Mapping[str, Any]) -> Unschedulable:
        with pytest.raises(Unschedulable) as refusal:
            self.take(spec)
        return refusal.value


def names(found: Allocation) -> list[tuple[str, str]]:
    return [(d.request, d.device) for d in found.devices]


def eight() -> Scene:
    return Scene([slice_of([gpu(i) for i in range(8)])])


def test_count_takes_the_first_free_devices_in_published_order() -> None:
    scene = eight()
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-0")]
    assert names(scene.take(claim(exactly(count=2)))) == [("gpu", "gpu-1"), ("gpu", "gpu-2")]
    assert names(scene.take(claim(exactly("a"), exactly("b")))) == [("a", "gpu-3"), ("b", "gpu-4")]


def test_a_claim_for_more_than_is_free_is_refused_as_the_scheduler_says() -> None:
    scene = eight()
    scene.take(claim(exactly(count=7)))
    refusal = scene.refused(claim(exactly(count=2)))
    assert str(refusal) == CANNOT_ALLOCATE == "0/1 nodes are available: 1 cannot allocate all claims."
    assert "request gpu: 8 devices match" in refusal.why
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-7")]  # nothing was taken by the refusal


def test_a_missing_class_and_a_bad_selector_are_refused_naming_them() -> None:
    scene = eight()
    missing = scene.refused(claim({"name": "gpu", "exactly": {"deviceClassName": "nope.example.com"}}))
    assert str(missing) == (
        'request gpu: could not retrieve device class nope.example.com: deviceclass.resource.k8s.io "nope.example.com" not found'
    )
    bad = scene.refused(claim(exactly(selectors=[cel("device.driver ==")])))
    assert str(bad).startswith("request gpu: selector: compilation failed")
    runtime = scene.refused(claim(exactly(selectors=[cel('device.attributes["gpu.example.com"].nope == 1')])))
    assert str(runtime) == "request gpu: selector #1: CEL runtime error: no such member in mapping: 'nope'"


def test_cel_selects_by_attribute_capacity_and_version() -> None:
    scene = Scene([slice_of([gpu(i, attrs={"driverVersion": {"version": f"1.{i}.0"}}) for i in range(4)])])
    picked = scene.take(claim(exactly(selectors=[cel("device.attributes['gpu.example.com'].index == 2")])))
    assert names(picked) == [("gpu", "gpu-2")]
    newer = cel("device.attributes['gpu.example.com'].driverVersion.isGreaterThan(semver('1.0.0'))")
    assert names(scene.take(claim(exactly(selectors=[newer])))) == [("gpu", "gpu-1")]
    big = cel("device.capacity['gpu.example.com'].memory.compareTo(quantity('81Gi')) >= 0")
    assert "request gpu: 0 devices match" in scene.refused(claim(exactly(selectors=[big]))).why
    other_domain = cel("'x' in device.attributes['other.example.com']")
    assert scene.refused(claim(exactly(selectors=[other_domain]))).message == CANNOT_ALLOCATE


def test_allocation_mode_all_takes_every_match_and_needs_them_all_free() -> None:
    scene = eight()
    everything = claim(exactly(allocationMode="All"))
    assert [d for _, d in names(scene.take(everything))] == [f"gpu-{i}" for i in range(8)]
    scene.held.clear()
    scene.take(claim(exactly()))
    scene.refused(everything)
    nothing = cel("device.attributes['gpu.example.com'].index > 100")
    scene.held.clear()
    scene.refused(claim(exactly(allocationMode="All", selectors=[nothing])))


def test_admin_access_takes_held_devices_and_holds_nothing() -> None:
    scene = Scene([slice_of([gpu(0), gpu(1)])])
    scene.take(claim(exactly(count=2)))
    admin = scene.take(claim(exactly(allocationMode="All", adminAccess=True)))
    assert [(d.device, d.admin_access) for d in admin.devices] == [("gpu-0", True), ("gpu-1", True)]
    scene.held.pop(0)
    assert names(scene.take(claim(exactly(count=2)))) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    scene = eight()
    future = {
        "name": "future",
        "deviceClassName": DRIVER,
        "selectors": [cel("device.attributes['gpu.example.com'].model == 'NEXT'")],
    }
    latest = {
        "name": "latest",
        "deviceClassName": DRIVER,
        "selectors": [cel("device.attributes['gpu.example.com'].model == 'LATEST-GPU-MODEL'")],
    }
    many = {"name": "many", "deviceClassName": DRIVER, "count": 9}
    one = {"name": "one", "deviceClassName": DRIVER}
    assert names(scene.take(claim({"name": "gpu", "firstAvailable": [future, one]}))) == [
        ("gpu/one", "gpu-0")
    ]
    assert names(scene.take(claim({"name": "gpu", "firstAvailable": [latest, one]}))) == [
        ("gpu/latest", "gpu-1")
    ]
    assert names(scene.take(claim({"name": "gpu", "firstAvailable": [many, one]}))) == [("gpu/one", "gpu-2")]


def test_match_attribute_backtracks_to_devices_that_agree() -> None:
    numa = [gpu(i, attrs={"numa": {"int": n}}) for i, n in enumerate([0, 1, 1])]
    scene = Scene([slice_of(numa)])
    same = {"constraints": [{"requests": ["a", "b"], "matchAttribute": "gpu.example.com/numa"}]}
    found = scene.take(claim(exactly("a"), exactly("b"), **same))
    assert names(found) == [("a", "gpu-1"), ("b", "gpu-2")]
    scene.held.clear()
    distinct = {"constraints": [{"distinctAttribute": "gpu.example.com/numa"}]}
    assert names(scene.take(claim(exactly("a", count=2), **distinct))) == [("a", "gpu-0"), ("a", "gpu-1")]
    missing = {"constraints": [{"matchAttribute": "gpu.example.com/absent"}]}
    scene.refused(claim(exactly("c"), **missing))


def partitions(shared: bool = False) -> Scene:
    """A card of 80Gi, its full device and four 20Gi partitions drawing on one counter set."""

    def device(name: str, memory: str, **attrs: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name,
            "attributes": {k: {"bool": v} for k, v in attrs.items()},
            "capacity": {"memory": {"value": memory}},
            "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": memory}}}],
        }
        return body | ({"allowMultipleAllocations": True} if shared else {})

    parts = [device(f"gpu-0-partition-{j}", "20Gi", partition=True) for j in range(4)]
    return Scene(
        [
            slice_of([], name="a-counters", counters={"gpu-0-counters": {"memory": "80Gi"}}),
            slice_of([*parts, device("gpu-0-full", "80Gi", full=True)], name="b-devices"),
        ]
    )


FULL = claim(exactly(selectors=[cel("'full' in device.attributes['gpu.example.com']")]))
PART = claim(exactly(count=2, selectors=[cel("'partition' in device.attributes['gpu.example.com']")]))


def test_no_shared_counter_is_overdrawn_either_way() -> None:
    scene = partitions()
    assert [d for _, d in names(scene.take(PART))] == ["gpu-0-partition-0", "gpu-0-partition-1"]
    scene.refused(FULL)
    assert [d for _, d in names(scene.take(PART))] == ["gpu-0-partition-2", "gpu-0-partition-3"]
    scene.held.clear()
    assert names(scene.take(FULL)) == [("gpu", "gpu-0-full")]
    scene.refused(claim(exactly(selectors=[cel("'partition' in device.attributes['gpu.example.com']")])))


def test_a_device_whose_counter_set_is_missing_is_never_allocated() -> None:
    scene = partitions()
    scene.slices.pop(0)
    scene.refused(FULL)


def test_shares_are_summed_against_the_capacity_and_counted_once_for_counters() -> None:
    scene = partitions(shared=True)
    asked = claim(
        exactly(
            selectors=[cel("'full' in device.attributes['gpu.example.com']")],
            capacity={"requests": {"memory": "30Gi"}},
        )
    )
    first, second = scene.take(asked), scene.take(asked)
    for found in (first, second):
        ((result),) = found.devices
        assert (result.device, dict(result.consumed)) == ("gpu-0-full", {"memory": "30Gi"})
    assert first.devices[0].share_id != second.devices[0].share_id != ""
    scene.refused(asked)  # 90Gi of 80Gi
    scene.refused(PART)  # the full card's counters are all consumed, however many shares it has


def test_request_policies_round_up_and_bound_what_a_share_takes() -> None:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "8Gi"}}
    nic = {
        "name": "nic-0",
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {"value": "16Gi", "requestPolicy": policy},
            "queues": {"value": "8", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}},
        },
    }
    scene = Scene([slice_of([nic])])
    consumed = [dict(scene.take(claim(exactly(capacity={"requests": r}))).devices[0].consumed) for r in (
        {"memory": "1500Mi", "queues": "3"}, {}, {"memory": "100Mi", "queues": "1"},
    )]  # fmt: skip
    assert consumed == [
        {"memory": "2Gi", "queues": "4"},  # stepped up to 2Gi; 3 queues up to the valid 4
        {"memory": "1Gi", "queues": "2"},  # the defaults
        {"memory": "1Gi", "queues": "1"},  # raised to the minimum
    ]
    scene.refused(claim(exactly(capacity={"requests": {"memory": "9Gi"}})))  # above max
    scene.refused(claim(exactly(capacity={"requests": {"queues": "5"}})))  # above every valid value
    scene.refused(claim(exactly(capacity={"requests": {"bandwidth": "1G"}})))  # no such capacity
    scene.refused(claim(exactly(capacity={"requests": {"queues": "2"}})))  # 7 of 8 taken


def test_a_capacity_without_a_policy_is_taken_whole_unless_asked_for() -> None:
    scene = Scene(
        [
            slice_of(
                [{"name": "nic-0", "allowMultipleAllocations": True, "capacity": {"bw": {"value": "10G"}}}]
            )
        ]
    )
    assert dict(scene.take(claim(exactly(capacity={"requests": {"bw": "4G"}}))).devices[0].consumed) == {
        "bw": "4G"
    }
    scene.refused(claim(exactly()))
    assert dict(scene.take(claim(exactly(capacity={"requests": {"bw": "6000M"}}))).devices[0].consumed) == {
        "bw": "6000M"
    }
    scene.held.clear()
    assert dict(scene.take(claim(exactly())).devices[0].consumed) == {"bw": "10G"}


def test_an_unshared_device_must_have_the_capacity_asked_for() -> None:
    scene = eight()
    scene.refused(claim(exactly(capacity={"requests": {"memory": "81Gi"}})))
    found = scene.take(claim(exactly(capacity={"requests": {"memory": "80Gi"}})))
    assert (found.devices[0].share_id, dict(found.devices[0].consumed)) == ("", {})


def test_taints_keep_devices_from_requests_that_do_not_tolerate_them() -> None:
    taint = {"key": "example.com/unhealthy", "value": "true", "effect": "NoSchedule"}
    scene = Scene([slice_of([gpu(0, taints=[taint]), gpu(1, taints=[{**taint, "effect": "None"}])])])
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-1")]  # effect None keeps nothing away
    scene.refused(claim(exactly()))
    wrong = [{"key": "example.com/unhealthy", "operator": "Equal", "value": "false"}]
    scene.refused(claim(exactly(tolerations=wrong)))
    other_effect = [{"key": "example.com/unhealthy", "operator": "Exists", "effect": "NoExecute"}]
    scene.refused(claim(exactly(tolerations=other_effect)))
    exists = [{"key": "example.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    assert names(scene.take(claim(exactly(tolerations=exists)))) == [("gpu", "gpu-0")]


def test_a_device_taint_rule_taints_the_devices_it_selects() -> None:
    scene = eight()
    taint = {"key": "example.com/unhealthy", "value": "true", "effect": "NoExecute"}
    scene.rules.append(
        {"spec": {"deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}, "taint": taint}}
    )
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-1")]
    scene.rules[0]["spec"]["deviceSelector"] = {"driver": DRIVER}
    scene.refused(claim(exactly()))
    equal = [{"key": "example.com/unhealthy", "operator": "Equal", "value": "true", "effect": "NoExecute"}]
    assert names(scene.take(claim(exactly(tolerations=equal)))) == [("gpu", "gpu-0")]
    scene.rules[0]["spec"]["deviceSelector"] = {"driver": "other.example.com"}
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-2")]


def test_configs_of_the_class_come_first_for_the_requests_that_used_it() -> None:
    scene = eight()
    scene.classes[DRIVER] = {**driver_class(DRIVER), "spec": {**driver_class(DRIVER)["spec"], "config": [
        {"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}
    ]}}  # fmt: skip
    own = [{"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"from": "claim"}}}]
    found = scene.take(claim(exactly("a"), exactly("b"), config=own))
    assert found.configs == (
        OpaqueConfig(DRIVER, {"from": "class"}, ("a", "b")),
        OpaqueConfig(DRIVER, {"from": "claim"}, ("b",)),
    )


def test_only_the_newest_generation_of_a_pool_and_the_node_asked_for_count() -> None:
    old = slice_of([gpu(0)], name="old", generation=1)
    new = slice_of([gpu(5)], name="new", generation=2)
    elsewhere = slice_of([gpu(9)], name="other", pool="node-b") | {}
    elsewhere["spec"]["nodeName"] = "node-b"
    found = allocate(
        claim(exactly(allocationMode="All")),
        slices=[old, new, elsewhere],
        classes={DRIVER: driver_class(DRIVER)},
        node="node-a",
    )
    assert [d.device for d in found.devices] == ["gpu-5"]


def two_cards_and_a_nic() -> Scene:
    """Two 80Gi cards, each whole or in 20Gi/40Gi partitions on its counters, and a shared 10G NIC."""
    devices, counters = [], {}
    for card in range(2):
        counters[f"card-{card}"] = {"memory": "80Gi"}
        for name, memory in [
            ("full", "80Gi"),
            ("half-0", "40Gi"),
            ("half-1", "40Gi"),
            *((f"q-{j}", "20Gi") for j in range(4)),
        ]:
            devices.append(
                {
                    "name": f"card-{card}-{name}",
                    "attributes": {"card": {"int": card}, "kind": {"string": name.partition("-")[0]}},
                    "consumesCounters": [
                        {"counterSet": f"card-{card}", "counters": {"memory": {"value": memory}}}
                    ],
                }
            )
    policy = {"default": "1G", "validRange": {"min": "1G", "step": "1G"}}
    devices.append(
        {
            "name": "nic-0",
            "allowMultipleAllocations": True,
            "capacity": {"bw": {"value": "10G", "requestPolicy": policy}},
        }
    )
    return Scene([slice_of([], name="a", counters=counters), slice_of(devices, name="b")])


def overdrawn(scene: Scene) -> list[str]:
    """What the held claims overdraw, counted from the slices alone: a device held twice (not as
    shares), a counter or a shared capacity beyond what is published."""
    published = {d["name"]: d for s in scene.slices for d in s["spec"].get("devices", ())}
    sets = {c["name"]: c["counters"] for s in scene.slices for c in s["spec"].get("sharedCounters", ())}
    whole = [d.device for c in scene.held for d in c.devices if not d.share_id and not d.admin_access]
    wrong = [f"{d} held twice" for d in set(whole) if whole.count(d) > 1]
    used: dict[str, int] = {}
    for device in set(whole) | {d.device for c in scene.held for d in c.devices if d.share_id}:
        for consumed in published[device].get("consumesCounters", ()):
            amount = int(consumed["counters"]["memory"]["value"].removesuffix("Gi"))
            used[consumed["counterSet"]] = used.get(consumed["counterSet"], 0) + amount
    wrong += [
        f"{s}: {n}Gi" for s, n in used.items() if n > int(sets[s]["memory"]["value"].removesuffix("Gi"))
    ]
    bandwidth = sum(
        int(d.consumed["bw"].removesuffix("G")) for c in scene.held for d in c.devices if d.share_id
    )
    return wrong + ([f"nic-0: {bandwidth}G"] if bandwidth > 10 else [])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.sampled_from(["full", "half", "q"]), st.integers(1, 3)),
            st.tuples(st.just("nic"), st.integers(1, 6), st.just(0)),
            st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
        ),
        max_size=25,
    )
)
def test_no_counter_is_overdrawn_and_no_device_held_twice_whatever_is_taken_and_released(
    steps: list[tuple[str, Any, int]],
) -> None:
    scene = two_cards_and_a_nic()
    for op, what, count in steps:
        if op == "release":
            if scene.held:
                scene.held.pop(what % len(scene.held))
            continue
        if op == "nic":
            spec = claim(
                exactly(
                    capacity={"requests": {"bw": f"{what}G"}},
                    selectors=[cel("device.allowMultipleAllocations")],
                )
            )
        else:
            spec = claim(
                exactly(
                    count=count,
                    selectors=[
                        cel(
                            f"'kind' in device.attributes['gpu.example.com'] && device.attributes['gpu.example.com'].kind == '{what}'"
                        )
                    ],
                )
            )
        try:
            scene.take(spec)
        except Unschedulable:
            if op == "take" and count == 1:  # refused only where no device of the kind fits
                assert not [d for d in devices_of(scene, what) if fits(scene, d)], (steps, scene.held)
        assert not overdrawn(scene), (steps, scene.held)


def devices_of(scene: Scene, kind: str) -> list[str]:
    return [
        d["name"]
        for s in scene.slices
        for d in s["spec"].get("devices", ())
        if d.get("attributes", {}).get("kind") == {"string": kind}
    ]


def fits(scene: Scene, device: str) -> bool:
    """Whether holding ``device`` too would overdraw nothing."""
    trial = Scene(
        scene.slices,
        held=[*scene.held, ClaimAllocation("trial", (AllocatedDevice("r", DRIVER, "node-a", device),))],
    )
    return not overdrawn(trial)


def test_all_devices_of_a_pool_being_rewritten_are_not_given_out() -> None:
    scene = Scene([slice_of([gpu(0), gpu(1)])])
    scene.slices[0]["spec"]["pool"]["resourceSliceCount"] = 2  # the second slice not written yet
    refusal = scene.refused(claim(exactly(allocationMode="All")))
    assert (
        str(refusal)
        == "request gpu: asks for all devices, but resource pool node-a is currently being updated"
    )
    assert names(scene.take(claim(exactly()))) == [("gpu", "gpu-0")]


def test_the_claims_of_one_pod_are_allocated_together_or_not_at_all() -> None:
    scene = Scene([slice_of([gpu(0), gpu(1)])])
    any_gpu = claim(exactly())
    first = claim(exactly(selectors=[cel("device.attributes['gpu.example.com'].index == 0")]))
    both = allocate_together([any_gpu, first], slices=scene.slices, classes=scene.classes)
    assert [names(a) for a in both] == [
        [("gpu", "gpu-1")],
        [("gpu", "gpu-0")],
    ]  # one at a time: gpu-0, then none
    with pytest.raises(Unschedulable):
        allocate_together([any_gpu, first, any_gpu], slices=scene.slices, classes=scene.classes)
    same = {"constraints": [{"matchAttribute": "gpu.example.com/index"}]}
    own = allocate_together(
        [claim(exactly(), **same), claim(exactly(), **same)], slices=scene.slices, classes=scene.classes
    )
    assert [names(a) for a in own] == [
        [("gpu", "gpu-0")],
        [("gpu", "gpu-1")],
    ]  # each claim's constraints its own


def test_a_claims_devices_are_all_on_one_node_the_first_where_they_fit() -> None:
    scene = Scene([slice_of([gpu(0)], name="a", pool="node-a"), slice_of([gpu(1)], name="b", pool="node-b")])
    scene.slices[1]["spec"]["nodeName"] = "node-b"
    refusal = scene.refused(claim(exactly(count=2)))
    assert str(refusal) == "0/2 nodes are available: 2 cannot allocate all claims."
    assert (
        refusal.why == "node node-a: request gpu: 1 devices match; node node-b: request gpu: 1 devices match"
    )
    assert [(d.pool, d.device) for d in scene.take(claim(exactly())).devices] == [("node-a", "gpu-0")]
    assert [(d.pool, d.device) for d in scene.take(claim(exactly())).devices] == [("node-b", "gpu-1")]
