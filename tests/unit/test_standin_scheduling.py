"""The stand-in API server allocates through the scheduler's rules, in the long and the short form."""

from __future__ import annotations

import re
from typing import Any

import pytest

from devicehost.standin.apiserver import ApiServerStandIn, Unschedulable, claim_spec
from devicehost.standin.scheduling import driver_class
from devicehost.testing.cluster import CANNOT_ALLOCATE, ClusterStandIn

DRIVER = "gpu.example.com"


def published(*devices: dict[str, Any]) -> ApiServerStandIn:
    cluster = ApiServerStandIn()
    spec = {
        "driver": DRIVER,
        "nodeName": "n",
        "pool": {"name": "n/gpu", "generation": 1},
        "devices": list(devices),
    }
    cluster.stored["n-gpu"] = {"metadata": {"name": "n-gpu", "resourceVersion": "1"}, "spec": spec}
    return cluster


def gpus(count: int) -> list[dict[str, Any]]:
    return [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(count)]


def test_the_short_form_is_a_claim_of_the_drivers_class() -> None:
    assert claim_spec(DRIVER, 2, "gpu/any", {"a": 1}, admin_access=True, consumed={"memory": "1Gi"}) == {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {"name": "any", "deviceClassName": DRIVER, "count": 2, "adminAccess": True,
                         "capacity": {"requests": {"memory": "1Gi"}}}
                    ],
                }
            ],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"a": 1}}}],
        }
    }  # fmt: skip


def test_a_named_device_is_still_refused_while_another_claim_holds_it() -> None:
    cluster = published(*gpus(2))
    ns, _, name = cluster.allocate(DRIVER, devices=["gpu-1"], name="first")
    assert [(d.request, d.device) for d in cluster.claims[(ns, name)].devices] == [("req", "gpu-1")]
    with pytest.raises(Unschedulable, match=f"^{re.escape(CANNOT_ALLOCATE)}$"):
        cluster.allocate(DRIVER, devices=["gpu-1"])
    assert [d.device for d in cluster.claims[("default", cluster.allocate(DRIVER)[2])].devices] == ["gpu-0"]
    assert len(cluster.claims) == 2


def test_claims_name_stored_classes_and_stored_taint_rules_taint_devices() -> None:
    cluster: ClusterStandIn = published(*gpus(3))
    cluster.classes["odd.example.com"] = {
        "spec": {
            "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].index % 2 == 1"}}]
        }
    }
    odd = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "odd.example.com"}}]}}
    ns, _, name = cluster.allocate_claim(odd, name="odd")
    assert [d.device for d in cluster.claims[(ns, name)].devices] == ["gpu-1"]
    taint = {"key": "example.com/broken", "effect": "NoSchedule"}
    cluster.taint_rules["all"] = {"spec": {"deviceSelector": {"driver": DRIVER}, "taint": taint}}
    with pytest.raises(Unschedulable):
        cluster.allocate(DRIVER)
    with pytest.raises(Unschedulable, match=r"device class gizmo\.example\.com"):
        cluster.allocate_claim(
            {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gizmo.example.com"}}]}}
        )
    assert list(cluster.claims) == [("default", "odd")]


def test_the_claim_shows_a_shares_id_and_what_it_took() -> None:
    shared = {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "8Gi",
                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
            }
        },
    }
    cluster = published(shared)
    refs = [cluster.allocate(DRIVER, consumed={"memory": "3Gi"}), cluster.allocate(DRIVER)]
    results = [
        cluster.claim_body(ns, name)["status"]["allocation"]["devices"]["results"] for ns, _, name in refs
    ]
    assert [(r["consumedCapacity"], bool(r["shareID"])) for (r,) in results] == [
        ({"memory": "3Gi"}, True),
        ({"memory": "1Gi"}, True),
    ]
    with pytest.raises(Unschedulable):
        cluster.allocate(DRIVER, consumed={"memory": "5Gi"})  # 4Gi of 8Gi taken


def test_a_pods_claims_are_allocated_together_or_none_is() -> None:
    cluster = published(*gpus(2))
    cluster.classes[DRIVER] = {
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}
    }
    first = claim_spec(DRIVER) | {}
    first["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpu.example.com'].index == 0"}}
    ]
    refs = cluster.allocate_claims([("any", claim_spec(DRIVER)), ("first", first)])
    assert [[d.device for d in cluster.claims[(ns, name)].devices] for ns, _, name in refs] == [
        ["gpu-1"],
        ["gpu-0"],
    ]
    with pytest.raises(Unschedulable):
        cluster.allocate_claims([("", claim_spec(DRIVER)), ("", claim_spec(DRIVER))])
    assert len(cluster.claims) == 2


def test_a_claim_is_allocated_on_the_node_asked_for() -> None:
    cluster = published(*gpus(1))
    other = {**cluster.stored["n-gpu"], "metadata": {"name": "m-gpu"}}
    other["spec"] = {**other["spec"], "nodeName": "m", "pool": {"name": "m/gpu", "generation": 1}}
    cluster.stored["m-gpu"] = other
    ns, _, name = cluster.allocate_claim(claim_spec(DRIVER), classes={DRIVER: driver_class(DRIVER)}, node="m")
    assert [d.pool for d in cluster.claims[(ns, name)].devices] == ["m/gpu"]
    with pytest.raises(Unschedulable, match=re.escape("0/1 nodes are available")):
        cluster.allocate_claim(claim_spec(DRIVER), classes={DRIVER: driver_class(DRIVER)}, node="m")
