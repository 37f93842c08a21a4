"""A claim's devices as this host serves them (``host/dra/allocated.py``): each allocated device
found in the pool that publishes it (by its DRA name), checked, grouped by resource and request,
and the ClaimRequest a hook gets, its configuration checked by the backend's model (a refused
one fails the claim, naming the request)."""

from __future__ import annotations

from typing import Literal

import pytest
from drafakes import ModelRecorder, attached, fake_server, widgets
from pydantic import BaseModel

from devicehost import ClaimRequest, Device, Health, Share
from devicehost.host.dra import names
from devicehost.host.dra.allocated import ClaimRefused, claim_request, located, pick, requests_of
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, OpaqueConfig

DRIVER = "example.com"
WIDGETS, GIZMOS = "n/widget", "n/gizmo"


class Mode(BaseModel):
    mode: Literal["fast", "slow"]


def widget(device: str, request: str = "req", **more: object) -> AllocatedDevice:
    return AllocatedDevice(request, DRIVER, WIDGETS, device, **more)  # type: ignore[arg-type]


async def test_each_allocated_device_is_located_by_its_pool_and_dra_name() -> None:
    odd = Device("GPU_0")  # not a DNS label: published under a cleaned name
    with (
        fake_server(ModelRecorder(), [*widgets(1), odd]) as served,
        fake_server(ModelRecorder(), widgets(1), "example.com/gizmo") as gizmos,
    ):
        resources = {
            "example.com/widget": attached(served, WIDGETS),
            "example.com/gizmo": attached(gizmos, GIZMOS),
        }
        allocated = [
            widget(names.device_name("GPU_0")),
            AllocatedDevice("req", DRIVER, GIZMOS, "w0"),
            widget("w9"),
            AllocatedDevice("req", DRIVER, "n/elsewhere", "w0"),
        ]
        found = [(a.device, at and at.pool, d and d.id) for a, at, d in located(allocated, resources)]
    assert found == [
        (names.device_name("GPU_0"), WIDGETS, "GPU_0"),
        ("w0", GIZMOS, "w0"),
        ("w9", WIDGETS, None),  # the pool is ours, the device is not in it
        ("w0", None, None),  # no pool of this host
    ]


async def test_pick_groups_by_resource_and_request_and_refuses_what_it_cannot_serve() -> None:
    with fake_server(ModelRecorder(), widgets(3, w2=Health.UNHEALTHY)) as served:
        resources = {"example.com/widget": attached(served, WIDGETS)}
        picked = pick([widget("w0"), widget("w1", "other"), widget("w0", "other")], resources)
        assert {key: [f.device.id for f in found] for key, found in picked.items()} == {
            ("example.com/widget", "req"): ["w0"],
            ("example.com/widget", "other"): ["w1", "w0"],
        }
        refusals = {
            "pool 'n/elsewhere' is not served by this host": [
                AllocatedDevice("req", DRIVER, "n/elsewhere", "w0")
            ],
            "device 'w9' is not in pool 'n/widget'": [widget("w9")],
            "device 'w2' of pool 'n/widget' is unhealthy": [widget("w2")],
            "device 'w0' is allocated twice to request 'req'": [widget("w0"), widget("w0")],
        }
        for message, allocated in refusals.items():
            with pytest.raises(ClaimRefused, match=f"^{message}$"):
                pick(allocated, resources)
        (tainted,) = pick([widget("w2")], resources, tainted=True).values()  # its taint was tolerated
        assert [f.device.id for f in tainted] == ["w2"]


async def test_the_claim_request_carries_the_checked_config_admin_access_and_shares() -> None:
    configs = (
        OpaqueConfig(DRIVER, {"mode": "fast"}, ("req",)),
        OpaqueConfig(DRIVER, {"mode": "warp"}, ("bad",)),
    )
    claim = ClaimAllocation(
        "uid-1",
        (
            widget("w0", admin_access=True),
            widget("w1", share_id="s-1", consumed={"memory": "1Gi"}),
            widget("w2", "bad"),
        ),
        configs,
        namespace="team-a",
        name="c",
    )
    with fake_server(ModelRecorder(config_model=Mode), widgets(3)) as served:
        resources = {"example.com/widget": attached(served, WIDGETS)}
        found = pick(claim.devices_of(DRIVER), resources)[("example.com/widget", "req")]
        asked = claim_request(claim, DRIVER, "req", found)
        shares = {"w1": Share("s-1", {"memory": "1Gi"})}
        assert asked == ClaimRequest("req", "team-a/c", "uid-1", Mode(mode="fast"), True, shares)
        with pytest.raises(ClaimRefused, match=r"^request 'bad': .*mode"):
            requests_of(claim, DRIVER, resources, tainted=False)  # one refused request refuses the claim
        fine = ClaimAllocation("uid-2", claim.devices[:2], configs[:1], namespace="team-a", name="d")
        (request,) = requests_of(fine, DRIVER, resources, tainted=False)
        assert (request.resource, request.asked.config, [f.device.id for f in request.found]) == (
            "example.com/widget",
            Mode(mode="fast"),
            ["w0", "w1"],
        )
