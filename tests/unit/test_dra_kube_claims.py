"""kube.py off the cluster: a ResourceClaim's JSON as the kubelet plugin reads it, and the API
client's errors as one line naming what was done."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceClaimStatus

from devicehost.host.dra.cluster import (
    AllocatedDevice,
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    OpaqueConfig,
)
from devicehost.host.dra.kube import _errors, claim_allocation


def claim_json(devices: dict[str, Any] | None, uid: str = "uid-1") -> dict[str, Any]:
    """A ResourceClaim as the API server returns it (``to_dict()`` of lightkube's model)."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
    }
    if devices is not None:
        body["status"] = {"allocation": {"devices": devices, "nodeSelector": {}}}
    return body


def test_an_allocated_claim_with_admin_access_subrequests_and_configs_in_order() -> None:
    found = claim_allocation(
        claim_json(
            {
                "results": [
                    {"request": "gpu", "driver": "example.com", "pool": "n/widget", "device": "w0"},
                    {
                        "request": "mon",
                        "driver": "example.com",
                        "pool": "n/widget",
                        "device": "w0",
                        "adminAccess": True,
                    },
                    {
                        "request": "alt/older",
                        "driver": "other.org",
                        "pool": "n/x",
                        "device": "x1",
                        "adminAccess": None,
                    },
                ],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": "example.com", "parameters": {"n": 1}}},
                    {
                        "source": "FromClaim",
                        "requests": ["gpu"],
                        "opaque": {"driver": "example.com", "parameters": {"n": 2}},
                    },
                    {"source": "FromClaim", "requests": ["alt"], "opaque": {"driver": "other.org"}},
                    {"source": "FromClaim", "requests": ["gpu"]},  # no opaque config: not one of ours
                ],
            }
        )
    )
    assert found == ClaimAllocation(
        "uid-1",
        (
            AllocatedDevice("gpu", "example.com", "n/widget", "w0", False),
            AllocatedDevice("mon", "example.com", "n/widget", "w0", True),
            AllocatedDevice("alt/older", "other.org", "n/x", "x1", False),
        ),
        (
            OpaqueConfig("example.com", {"n": 1}, ()),
            OpaqueConfig("example.com", {"n": 2}, ("gpu",)),
            OpaqueConfig("other.org", {}, ("alt",)),
        ),
        "default",
        "c",
    )
    assert params(found, "example.com", "gpu") == {"n": 2}  # the claim's after the class's
    assert params(found, "example.com", "mon") == {"n": 1}
    assert params(found, "other.org", "alt/older") == {}  # the main request's config


def params(found: ClaimAllocation, driver: str, request: str) -> object:
    config = found.config(driver, request)
    return None if config is None else config.parameters


@pytest.mark.parametrize(
    "devices",
    [None, {}, {"results": None, "config": None}, {"results": []}],
)
def test_a_claim_not_allocated_has_no_devices(devices: dict[str, Any] | None) -> None:
    found = claim_allocation(claim_json(devices))
    assert found == ClaimAllocation("uid-1", (), (), "default", "c")


def test_one_read_carries_binding_conditions_and_the_status_a_status_write_needs() -> None:
    result = {"request": "nic", "driver": "example.org", "pool": "n/nic", "device": "n0"}
    body = claim_json({"results": [result | {"bindingConditions": ["A"], "bindingFailureConditions": ["F"]}]})
    shown = {"driver": "example.org", "pool": "n/nic", "device": "n0", "conditions": [{"type": "A"}]}
    body["status"]["devices"] = [shown]
    found = claim_allocation(body)
    (device,) = found.devices
    assert (device.binding_conditions, device.binding_failure_conditions) == (("A",), ("F",))
    assert found.status_of(device) == shown
    assert found.body is body  # what a status write sends back, with its resourceVersion


def test_a_claim_with_a_null_allocation_has_no_devices() -> None:
    body = claim_json(None)
    body["status"] = {"allocation": None}
    assert claim_allocation(body).devices == ()
    assert claim_allocation({}).uid == ""


def api_error(code: int, reason: str, message: str) -> ApiError:
    request = httpx2.Request("GET", "https://api/x")
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    response = httpx2.Response(code, json={**status, "message": message}, request=request)
    return ApiError(request=request, response=response)


def test_an_api_error_is_one_line_naming_what_was_done() -> None:
    with pytest.raises(ClusterError) as caught, _errors("replacing ResourceSlice s"):
        raise api_error(409, "Conflict", "the object has been modified")
    assert str(caught.value) == "replacing ResourceSlice s: 409 Conflict: the object has been modified"
    assert not isinstance(caught.value, NotFound)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_not_found_is_told_apart() -> None:
    with (
        pytest.raises(NotFound, match=r"^deleting ResourceSlice s: 404 NotFound: "),
        _errors("deleting ResourceSlice s"),
    ):
        raise api_error(404, "NotFound", 'resourceslices "s" not found')


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (httpx2.ConnectError("refused"), "listing ResourceSlices: ConnectError: refused"),
        (httpx2.ReadTimeout("slow"), "listing ResourceSlices: ReadTimeout: slow"),
        (ConnectionResetError("reset"), "listing ResourceSlices: ConnectionResetError: reset"),
    ],
)
def test_a_transport_error_is_one_line_naming_what_was_done(error: Exception, said: str) -> None:
    with pytest.raises(ClusterError) as caught, _errors("listing ResourceSlices"):
        raise error
    assert str(caught.value) == said
    assert type(caught.value) is ClusterError


def test_other_errors_pass_through() -> None:
    with pytest.raises(KeyError), _errors("anything"):
        raise KeyError("a bug, not the API server")


def test_a_conflict_is_its_own_error_a_status_writer_retries_on() -> None:
    with pytest.raises(Conflict) as caught, _errors("writing the status of ResourceClaim default/c"):
        raise api_error(409, "Conflict", "the object has been modified")
    assert str(caught.value).startswith("writing the status of ResourceClaim default/c: 409 Conflict")


def test_a_claim_with_device_status_survives_the_status_model() -> None:
    """What the host writes into ``status.devices`` goes through lightkube's status model unchanged."""
    body = claim_json(
        {"results": [{"request": "gpu", "driver": "example.com", "pool": "n/w", "device": "w0"}]}
    )
    body["metadata"]["resourceVersion"] = "7"
    body["status"]["allocation"].pop("nodeSelector")
    written = {
        "driver": "example.com",
        "pool": "n/w",
        "device": "w0",
        "conditions": [
            {
                "type": "Attached",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "data": {"vf": 3},
        "networkData": {"interfaceName": "net1", "ips": ["10.9.8.7/24"]},
    }
    body["status"]["devices"] = [written]
    round_trip = ResourceClaimStatus.from_dict(body).to_dict()
    assert round_trip["status"]["devices"] == [written]
    assert round_trip["metadata"]["resourceVersion"] == "7"
