"""The devices the stand-in's scheduler allocates from (``standin/catalog.py``): the newest
generation of each pool of the node, in the allocator's order, with their slices' and the
DeviceTaintRules' taints, capacities, counters and attributes; a pool missing slices of its
newest generation is incomplete."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from devicehost.standin.catalog import catalog

DRIVER = "example.com"


def slice_body(
    name: str, pool: str, generation: int, *devices: dict[str, Any], node: str = "n", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "driver": DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": spec.pop("count", 1)},
            "devices": list(devices),
            **spec,
        },
    }


def test_the_newest_generation_of_each_pool_of_the_node_in_the_allocators_order() -> None:
    slices = [
        slice_body("z-new", "p", 2, {"name": "w1"}, {"name": "w0"}),
        slice_body("a-old", "p", 1, {"name": "stale"}),
        slice_body("b", "o", 1, {"name": "x0"}, count=2),  # one slice of two: being rewritten
        slice_body("other-node", "q", 1, {"name": "y0"}, node="m"),
    ]
    found = catalog(slices, node="n")
    assert [(d.pool, d.name) for d in found.devices] == [("o", "x0"), ("p", "w1"), ("p", "w0")]
    assert found.incomplete == {(DRIVER, "o")}
    assert [d.name for d in catalog(slices).devices] == ["x0", "w1", "w0", "y0"]  # every node's


def test_taints_capacity_counters_and_attributes_as_the_allocator_reads_them() -> None:
    gpu = {
        "name": "g0",
        "taints": [{"key": "a", "effect": "NoSchedule"}],
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "2Gi"}},
        "consumesCounters": [{"counterSet": "mem", "counters": {"slices": {"value": "4"}}}],
        "attributes": {"model": {"string": "x1"}, "other.org/numa": {"int": 1}},
    }
    shared = {"sharedCounters": [{"name": "mem", "counters": {"slices": {"value": "8"}}}]}
    rule = {
        "spec": {
            "deviceSelector": {"driver": DRIVER, "device": "g0"},
            "taint": {"key": "b", "effect": "NoExecute"},
        }
    }
    elsewhere = {
        "spec": {"deviceSelector": {"pool": "elsewhere"}, "taint": {"key": "c", "effect": "NoExecute"}}
    }
    found = catalog([slice_body("s", "p", 1, gpu, {"name": "g1"}, **shared)], [rule, elsewhere])
    g0, g1 = found.devices
    assert [t["key"] for t in g0.taints] == ["a", "b"]
    assert g1.taints == ()
    assert (g0.multiple, g1.multiple) == (True, False)
    assert g0.capacity == {"memory": Decimal(2 * 1024**3)}
    assert g0.consumes == {"mem": {"slices": Decimal(4)}}
    assert found.counter_sets == {(DRIVER, "p", "mem"): {"slices": Decimal(8)}}
    assert g0.attribute(f"{DRIVER}/model") == ("string", "x1")  # unqualified: the driver's domain
    assert g0.attribute("other.org/numa") == ("int", 1)
    assert g0.attribute("other.org/model") is None
    assert found.by_key[(DRIVER, "p", "g1")] is g1
