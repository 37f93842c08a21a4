"""Which opaque configuration applies to a request (``ClaimAllocation.config``, host/dra/cluster.py)."""

from __future__ import annotations

from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, OpaqueConfig

DRIVER = "example.com"


def allocation(*configs: OpaqueConfig) -> ClaimAllocation:
    return ClaimAllocation("uid", (AllocatedDevice("gpu", DRIVER, "n/widget", "w0"),), configs)


def params(found: OpaqueConfig | None) -> object:
    return None if found is None else found.parameters


def test_the_last_config_naming_the_request_wins_class_then_claim() -> None:
    found = allocation(
        OpaqueConfig(DRIVER, {"from": "class"}),
        OpaqueConfig(DRIVER, {"from": "claim"}, ("gpu",)),
        OpaqueConfig(DRIVER, {"from": "claim, last"}, ("gpu", "other")),
    )
    assert params(found.config(DRIVER, "gpu")) == {"from": "claim, last"}
    assert params(found.config(DRIVER, "aux")) == {"from": "class"}  # only the class's names it


def test_a_config_naming_no_request_applies_to_every_one_and_may_win() -> None:
    found = allocation(OpaqueConfig(DRIVER, {"n": 1}, ("gpu",)), OpaqueConfig(DRIVER, {"n": 2}))
    assert params(found.config(DRIVER, "gpu")) == {"n": 2}
    assert params(found.config(DRIVER, "aux")) == {"n": 2}


def test_another_drivers_config_never_applies() -> None:
    found = allocation(OpaqueConfig(DRIVER, {"mine": True}), OpaqueConfig("other.org", {"mine": False}))
    assert params(found.config(DRIVER, "gpu")) == {"mine": True}
    assert found.config("third.org", "gpu") is None


def test_a_subrequest_takes_the_config_of_its_main_request_or_its_own() -> None:
    found = allocation(
        OpaqueConfig(DRIVER, {"for": "gpu"}, ("gpu",)),
        OpaqueConfig(DRIVER, {"for": "gpu/newer"}, ("gpu/newer",)),
    )
    assert params(found.config(DRIVER, "gpu/older")) == {"for": "gpu"}
    assert params(found.config(DRIVER, "gpu/newer")) == {"for": "gpu/newer"}
    assert found.config(DRIVER, "gpux/older") is None  # a main request is matched whole, not as a prefix
    assert params(found.config(DRIVER, "gpu")) == {"for": "gpu"}  # a main request never takes a subrequest's


def test_no_config_is_none() -> None:
    assert allocation().config(DRIVER, "gpu") is None
