"""The in-memory API server (``standin/apiserver.py``) and its claims as JSON with their status
(``standin/claimstatus.py``), answering as the real API server does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from devicehost.resourceapi import (
    AllocatedDevice,
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    OpaqueConfig,
)
from devicehost.standin.apiserver import ApiServerStandIn, Unschedulable
from devicehost.standin.claimstatus import ClaimStatuses
from devicehost.standin.scheduling import claim_spec

DRIVER = "example.com"


def slice_body(name: str, *devices: dict[str, Any], pool: str = "node-a/widget") -> dict[str, Any]:
    spec = {
        "nodeName": "node-a",
        "driver": DRIVER,
        "pool": {"name": pool, "generation": 1},
        "devices": list(devices),
    }
    return {"metadata": {"name": name}, "spec": spec}


async def test_slices_are_versioned_and_a_stale_replace_is_a_conflict() -> None:
    api = ApiServerStandIn()
    await api.create_slice(slice_body("s1", {"name": "w0"}))
    with pytest.raises(ClusterError, match="409 AlreadyExists"):
        await api.create_slice(slice_body("s1", {"name": "w0"}))
    stored = (await api.slices("node-a", DRIVER))["s1"]
    await api.replace_slice(
        {**slice_body("s1", {"name": "w0"}, {"name": "w1"}), "metadata": stored["metadata"]}
    )
    with pytest.raises(Conflict, match="409 Conflict"):
        await api.replace_slice({**slice_body("s1"), "metadata": stored["metadata"]})  # the old version
    assert api.devices(DRIVER) == [("node-a/widget", "w0"), ("node-a/widget", "w1")]
    assert await api.slices("node-b", DRIVER) == {}


async def test_taints_are_dropped_unless_the_server_keeps_them() -> None:
    api = ApiServerStandIn()
    tainted = {"name": "w0", "taints": [{"key": "example.com/unhealthy", "effect": "NoSchedule"}]}
    await api.create_slice(slice_body("s1", tainted))
    assert "taints" not in api.stored["s1"]["spec"]["devices"][0]
    api.device_taints_kept = True
    await api.create_slice(slice_body("s2", tainted, pool="node-a/gizmo"))
    assert api.stored["s2"]["spec"]["devices"][0]["taints"] == tainted["taints"]


async def test_a_down_server_fails_every_call_with_its_error() -> None:
    api = ApiServerStandIn()
    api.down = "dial tcp 10.0.0.1:6443: connection refused"
    with pytest.raises(ClusterError, match="connection refused"):
        await api.slices("node-a", DRIVER)
    with pytest.raises(ClusterError, match="connection refused"):
        await api.claim("default", "c")


async def test_a_claim_is_allocated_free_devices_and_shown_with_its_binding_conditions() -> None:
    api = ApiServerStandIn()
    bound = {"name": "w1", "bindingConditions": ["Attached"], "bindingFailureConditions": ["Failed"]}
    await api.create_slice(slice_body("s1", {"name": "w0"}, bound))
    first = api.allocate(DRIVER, devices=["w0"], name="first")
    namespace, uid, name = api.allocate(DRIVER, name="second")  # w0 is taken: w1
    with pytest.raises(Unschedulable, match="cannot allocate all claims"):
        api.allocate(DRIVER)
    claim = await api.claim(namespace, name)
    assert (claim.namespace, claim.name, claim.uid) == (namespace, name, uid)
    assert [(d.pool, d.device) for d in claim.devices] == [("node-a/widget", "w1")]
    body = api.claim_body(namespace, name)
    assert claim.body == body
    (result,) = body["status"]["allocation"]["devices"]["results"]
    assert result == {
        "request": "req",
        "driver": DRIVER,
        "pool": "node-a/widget",
        "device": "w1",
        "bindingConditions": ["Attached"],
        "bindingFailureConditions": ["Failed"],
    }
    assert (body["metadata"]["uid"], first[2]) == (uid, "first")
    assert not api.bindable(namespace, name)
    with pytest.raises(NotFound, match="404 NotFound"):
        await api.claim("default", "nope")


async def test_a_status_write_needs_the_current_version_and_an_allocated_device() -> None:
    api = ApiServerStandIn()
    await api.create_slice(slice_body("s1", {"name": "w0", "bindingConditions": ["Attached"]}))
    namespace, _, name = api.allocate(DRIVER)
    body = api.claim_body(namespace, name)
    device = {"driver": DRIVER, "pool": "node-a/widget", "device": "w0"}
    attached = {**device, "conditions": [{"type": "Attached", "status": "True"}]}
    with pytest.raises(ClusterError, match="422 Invalid: w9: must be an allocated device"):
        await api.replace_claim_status({**body, "status": {"devices": [{**device, "device": "w9"}]}})
    await api.replace_claim_status({**body, "status": {"devices": [attached]}})
    assert api.device_statuses(namespace, name) == [attached]
    assert api.bindable(namespace, name)
    with pytest.raises(Conflict, match="409 Conflict"):
        await api.replace_claim_status({**body, "status": {"devices": []}})  # the version before the write


async def test_watchers_see_claims_come_change_and_go() -> None:
    api = ApiServerStandIn()
    await api.create_slice(slice_body("s1", {"name": "w0"}))
    events = api.claim_events()
    namespace, _, name = api.allocate(DRIVER)
    kind, claim = await asyncio.wait_for(anext(events), 5)
    assert (kind, claim.namespace, claim.name) == ("ADDED", namespace, name)
    assert claim.body == api.claim_body(namespace, name)
    await api.replace_claim_status(
        {**claim.body, "status": {"devices": [{"driver": DRIVER, "pool": "node-a/widget", "device": "w0"}]}}
    )
    kind, claim = await asyncio.wait_for(anext(events), 5)
    assert (kind, claim.name, [s["device"] for s in claim.statuses]) == ("MODIFIED", name, ["w0"])
    last = api.claim_body(namespace, name)
    del api.claims[(namespace, name)]
    kind, claim = await asyncio.wait_for(anext(events), 5)  # with its last state, as a real watch
    assert (kind, claim.namespace, claim.name, claim.body) == ("DELETED", namespace, name, last)
    assert [d.device for d in claim.devices] == ["w0"]
    await events.aclose()


def test_every_claim_shows_a_spec_whose_requests_its_results_name() -> None:
    """The API server never shows a claim without its ``spec`` (clients such as lightkube's
    models at their 1.35 floor refuse one); a claim a test stores directly gets the spec its
    allocation answers."""
    api = ApiServerStandIn()
    api.stored["s1"] = slice_body("s1", {"name": "w0"}, {"name": "w1"}, {"name": "w2"})
    written = api.allocate(DRIVER, 2, request="gpus/big", config={"mode": "x"})
    api.claims[("default", "stored")] = ClaimAllocation(
        "uid-stored",
        (AllocatedDevice("a", DRIVER, "node-a/widget", "w2", admin_access=True),),
        (OpaqueConfig(DRIVER, {"k": 1}, ("a",)),),
    )
    bodies = [api.claim_body(written[0], written[2]), api.claim_body("default", "stored")]
    assert bodies[0]["spec"] == claim_spec(DRIVER, 2, "gpus/big", {"mode": "x"})
    assert bodies[1]["spec"] == {
        "devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": DRIVER, "count": 1, "adminAccess": True}}
            ],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {"k": 1}}, "requests": ["a"]}],
        }
    }
    for body in bodies:
        names = {r["name"] for r in body["spec"]["devices"]["requests"]}
        results = body["status"]["allocation"]["devices"]["results"]
        assert {r["request"].partition("/")[0] for r in results} <= names


def test_the_claim_side_says_what_it_needs_from_its_server() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ClaimStatuses()  # type: ignore[abstract]
    api = ApiServerStandIn()
    assert (api.claims, api.statuses, api.changed.is_set()) == ({}, {}, False)
