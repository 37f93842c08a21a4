"""Binding conditions and a claim's device status, through DRA on the in-memory API server.

A backend publishes NICs that must be attached before a pod may bind: the host follows a claim
allocated one, writes what the device status hook says into the claim's ``status.devices`` until
the condition holds, and after prepare writes the NIC's network data and facts, beside what other
drivers wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pydantic
import pytest
import structlog
from drafakes import dra_host, dra_root
from waiting import eventually

import devicehost
from devicehost import (
    ClaimRequest,
    ContainerAllocation,
    Device,
    DeviceCondition,
    DeviceStatus,
    NetworkData,
    Resource,
)
from devicehost.hookspecs import rules
from devicehost.host.backends.backend import AnswerRefused, Backend
from devicehost.host.daemon import Host
from devicehost.host.dra.claim_status import entry, merged
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, ClusterError, OpaqueConfig
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint

DRIVER = "example.org"
POOL = "n/nic"
ATTACHED, FAILED = "example.org/Attached", "AttachFailed"


class Nics:
    """example.org/nic: n0, n1 with binding conditions; attached once ``attached`` holds them."""

    def __init__(self) -> None:
        self.attached: set[str] = set()
        self.asked: list[tuple[tuple[str, ...], str, bool]] = []
        self.answer: Any = None

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        nics = (
            Device(f"n{i}", binding_conditions=(ATTACHED,), binding_failure_conditions=(FAILED,))
            for i in range(2)
        )
        return [Resource("example.org/nic", tuple(nics))]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"NICS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_device_status(
        self, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
    ) -> Any:
        self.asked.append((device_ids, claim.name, prepared))
        if self.answer is not None:
            return self.answer
        statuses = {}
        for i in device_ids:
            up = i in self.attached
            reason = "Attached" if up else "Attaching"
            status = DeviceStatus(conditions={ATTACHED: DeviceCondition(status=up, reason=reason)})
            if prepared:
                network = NetworkData(
                    interface_name="net1", ips=("10.9.8.7/24",), hardware_address="02:00:00:00:00:01"
                )
                status = DeviceStatus(conditions=status.conditions, data={"vf": 3}, network=network)
            statuses[i] = status
        return statuses


@pytest.fixture
def root() -> Iterator[Path]:
    with dra_root("drb-") as made:
        yield made


def host_of(root: Path, backend: object, cluster: ClusterStandIn) -> AbstractAsyncContextManager[Host]:
    return dra_host(root, {"nics": backend}, cluster, "n", rediscover_interval=0.05)


def claim(cluster: ClusterStandIn, *devices: str, other: bool = False) -> tuple[str, str, str]:
    """A claim of the NICs ``devices`` (and a device of another driver with ``other``)."""
    uid = f"uid-{len(cluster.claims)}"
    allocated = [AllocatedDevice("nic", DRIVER, POOL, d) for d in devices]
    allocated += [AllocatedDevice("gpu", "gpu.example.com", "n/gpu", "gpu-0")] if other else []
    cluster.claims[("default", uid)] = ClaimAllocation(uid, tuple(allocated))
    return "default", uid, uid


def condition(cluster: ClusterStandIn, ref: tuple[str, str, str], device: str) -> dict[str, Any] | None:
    for status in cluster.device_statuses(ref[0], ref[2]):
        if status["device"] == device:
            return next((c for c in status.get("conditions", ()) if c["type"] == ATTACHED), None)
    return None


async def test_the_slice_carries_each_device_binding_conditions(root: Path) -> None:
    cluster = ClusterStandIn()
    async with host_of(root, Nics(), cluster):
        await cluster.wait(lambda c: bool(c.stored))
        (body,) = cluster.stored.values()
        for device in body["spec"]["devices"]:
            assert device["bindingConditions"] == [ATTACHED]
            assert device["bindingFailureConditions"] == [FAILED]


async def test_a_claim_binds_once_the_backend_says_attached(root: Path) -> None:
    backend, cluster = Nics(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: bool(c.stored))
        ref = claim(cluster, "n0")
        await cluster.wait(lambda c: condition(c, ref, "n0") is not None)
        waiting = condition(cluster, ref, "n0")
        assert waiting is not None
        assert (waiting["status"], waiting["reason"]) == ("False", "Attaching")
        assert not cluster.bindable(*ref[::2])
        await asyncio.sleep(1.5)  # asked again, the answer the same: written once, its time kept
        assert condition(cluster, ref, "n0") == waiting
        assert len(backend.asked) >= 2
        assert all(asked == (("n0",), "nic", False) for asked in backend.asked)
        backend.attached.add("n0")
        await cluster.wait(lambda c: c.bindable(*ref[::2]), timeout=5)
        ready = condition(cluster, ref, "n0")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("True", "Attached")
        asked = len(backend.asked)
        await asyncio.sleep(1.5)
        assert len(backend.asked) == asked  # nothing awaited any more: not asked again


async def test_a_failure_condition_ends_the_wait(root: Path) -> None:
    backend, cluster = Nics(), ClusterStandIn()
    backend.answer = {"n1": DeviceStatus(conditions={FAILED: DeviceCondition(status=True, reason="NoLink")})}
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: bool(c.stored))
        ref = claim(cluster, "n1")
        await cluster.wait(lambda c: bool(c.device_statuses(ref[0], ref[2])))
        asked = len(backend.asked)
        await asyncio.sleep(1.5)
        assert len(backend.asked) == asked
        assert not cluster.bindable(*ref[::2])


async def test_after_prepare_the_status_holds_network_data_beside_other_drivers(root: Path) -> None:
    backend, cluster = Nics(), ClusterStandIn()
    backend.attached.add("n0")
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: bool(c.stored))
        ref = claim(cluster, "n0", other=True)
        await cluster.wait(lambda c: c.bindable(*ref[::2]))
        theirs = {"driver": "gpu.example.com", "pool": "n/gpu", "device": "gpu-0", "data": {"theirs": True}}
        body = cluster.claim_body(ref[0], ref[2])
        body["status"]["devices"].append(theirs)
        await cluster.replace_claim_status(body)
        (socket,) = (root / "registry").glob("devicehost-example.org-*.sock")
        where = (await registered_endpoint(socket)).endpoint
        answer = await prepare(where, [ref])
        assert not answer.claims[ref[1]].error
        ours, kept = cluster.device_statuses(ref[0], ref[2])
        assert kept == theirs
        assert ours["networkData"] == {
            "interfaceName": "net1",
            "ips": ["10.9.8.7/24"],
            "hardwareAddress": "02:00:00:00:00:01",
        }
        assert ours["data"] == {"vf": 3}
        assert [(c["type"], c["status"]) for c in ours["conditions"]] == [(ATTACHED, "True")]
        assert backend.asked[-1] == (("n0",), "nic", True)


async def test_a_refused_answer_is_not_written(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backend, cluster = Nics(), ClusterStandIn()
    backend.answer = {"n0": DeviceStatus(network=NetworkData(ips=("10.9.8.7",)))}
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: bool(c.stored))
        ref = claim(cluster, "n0")
        await asyncio.sleep(2.5)
        assert cluster.device_statuses(ref[0], ref[2]) == []
    said = capsys.readouterr()
    assert (said.out + said.err).count("binding conditions not written") == 1
    assert "not in CIDR notation" in said.out + said.err


async def test_a_backend_with_binding_conditions_needs_the_status_hook() -> None:
    class NoHook:
        @devicehost.hookimpl
        def devicehost_discover(self) -> list[Resource]:
            device = Device("n0", binding_conditions=(ATTACHED,), binding_failure_conditions=(FAILED,))
            return [Resource("example.org/nic", (device,))]

        @devicehost.hookimpl
        def devicehost_allocate(self) -> ContainerAllocation:
            return ContainerAllocation()

    backend = Backend("nohook", NoHook(), hook_timeout=2)
    try:
        with pytest.raises(AnswerRefused, match="devicehost_device_status is not implemented"):
            await backend.discover()
    finally:
        backend.close()


def test_binding_condition_rules() -> None:
    def problem(conditions: tuple[str, ...], failures: tuple[str, ...]) -> str | None:
        return rules.device_problem(
            Device("d", binding_conditions=conditions, binding_failure_conditions=failures)
        )

    assert problem(("A",), ("B",)) is None
    assert problem(("example.com/Attached",), ("F",)) is None
    assert "go together" in str(problem(("A",), ()))
    assert "go together" in str(problem((), ("B",)))
    assert "at most 4" in str(problem(("A", "B", "C", "D", "E"), ("F",)))
    assert "both binding and binding failure" in str(problem(("A",), ("A",)))
    assert "repeats" in str(problem(("A", "A"), ("B",)))
    assert "condition type 'not ok'" in str(problem(("not ok",), ("B",)))


def test_device_status_rules() -> None:
    good = DeviceStatus(conditions={"Ready": DeviceCondition(status=True, reason="Ready")}, data={"a": 1})
    assert rules.device_status_problem({"d": good}, ["d"]) is None
    assert "not asked about" in str(rules.device_status_problem({"e": good}, ["d"]))
    assert "CamelCase" in str(
        rules.device_status_problem(
            {"d": DeviceStatus(conditions={"R": DeviceCondition(status=True, reason="no way")})}, ["d"]
        )
    )
    big = DeviceStatus(data={"x": "y" * 20000})
    assert "at most 10240" in str(rules.device_status_problem({"d": big}, ["d"]))
    many = DeviceStatus(network=NetworkData(ips=tuple(f"10.0.0.{i}/24" for i in range(17))))
    assert "at most 16" in str(rules.device_status_problem({"d": many}, ["d"]))
    assert "expected a mapping" in str(rules.device_status_problem([good], ["d"]))


def test_a_condition_keeps_its_transition_time_while_its_status_stays() -> None:
    result = {"driver": DRIVER, "pool": POOL, "device": "n0"}
    device = AllocatedDevice("nic", DRIVER, POOL, "n0")
    up = DeviceStatus(conditions={ATTACHED: DeviceCondition(status=True, reason="Attached", message="up")})
    earlier = {**result, "conditions": [{"type": ATTACHED, "status": "True", "reason": "Attaching",
                                          "message": "", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}  # fmt: skip
    written = entry(device, up, earlier)
    assert "request" not in written
    (kept,) = written["conditions"]
    assert (kept["reason"], kept["message"], kept["lastTransitionTime"]) == (
        "Attached",
        "up",
        "2020-01-01T00:00:00Z",
    )
    down = DeviceStatus(conditions={ATTACHED: DeviceCondition(status=False, reason="LinkDown")})
    assert entry(device, down, written)["conditions"][0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    other = {"driver": "x.org", "pool": "p", "device": "d"}
    assert merged([other, earlier], [written]) == [other, written]
    assert merged([other], [written]) == [other, written]


class StrictNics(Nics):
    """:class:`Nics` whose claim configuration model takes only ``mtu``."""

    @devicehost.hookimpl
    def devicehost_claim_config_model(self) -> Any:
        return NicConfig


class NicConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    mtu: int = 1500


async def test_a_configuration_the_backend_refuses_fails_the_claim_in_status_as_in_prepare(
    root: Path,
) -> None:
    backend, cluster = StrictNics(), ClusterStandIn()
    with structlog.testing.capture_logs() as logs:
        async with host_of(root, backend, cluster):
            await cluster.wait(lambda c: bool(c.stored))
            ref = ("default", "uid-bad", "bad")
            bad = (OpaqueConfig(DRIVER, {"speed": "fast"}),)
            cluster.claims[ref[::2]] = ClaimAllocation(
                ref[1], (AllocatedDevice("nic", DRIVER, POOL, "n0"),), bad
            )
            await eventually(
                lambda: any(e["event"] == "binding conditions not written" for e in logs), "refused"
            )
            (socket,) = (root / "registry").glob("devicehost-example.org-*.sock")
            answer = await prepare((await registered_endpoint(socket)).endpoint, [ref])
    assert "parameters.speed" in answer.claims[ref[1]].error  # the one rule: the claim fails
    (said,) = [e for e in logs if e["event"] == "binding conditions not written"]
    assert "parameters.speed" in said["error"]
    assert backend.asked == []  # never asked with a configuration it refuses, nor with None
    assert cluster.device_statuses(*ref[::2]) == []


class FlakyWatch(ClusterStandIn):
    """An API server that refuses the claim watch ``refusals`` times, naming a new resourceVersion each time."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.watches = 0

    async def claim_events(self) -> AsyncIterator[tuple[str, ClaimAllocation]]:
        self.watches += 1
        if self.watches <= self.refusals:
            raise ClusterError(f"watching ResourceClaims: 410 Gone: too old resource version: {self.watches}")
        async for event in super().claim_events():
            yield event


async def test_a_refused_claim_watch_is_retried_with_backoff_and_said_once(root: Path) -> None:
    cluster = FlakyWatch(refusals=2)
    with structlog.testing.capture_logs() as logs:
        async with host_of(root, Nics(), cluster):
            await cluster.wait(lambda c: bool(c.stored))
            ref = claim(cluster, "n0")
            await cluster.wait(lambda c: condition(c, ref, "n0") is not None, timeout=10)
    events = [entry["event"] for entry in logs]
    assert cluster.watches == 3  # two refused, then one that works: no spin
    assert events.count("watching ResourceClaims failed, retrying with backoff") == 1
    assert events.count("watching ResourceClaims again") == 1


class SharedNics(Nics):
    """The NICs allowing multiple allocations: each claim holds a share of one."""

    def __init__(self) -> None:
        super().__init__()
        self.shares: list[dict[str, str]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        (nics,) = super().devicehost_discover()
        shared = tuple(dataclasses.replace(d, allow_multiple_allocations=True) for d in nics.devices)
        return [dataclasses.replace(nics, devices=shared)]

    @devicehost.hookimpl
    def devicehost_device_status(
        self, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
    ) -> Any:
        self.shares.append({d: s.id for d, s in claim.shares.items()})
        return super().devicehost_device_status(device_ids, claim, prepared)


async def test_a_shared_device_is_asked_about_and_written_with_its_share(root: Path) -> None:
    backend, cluster = SharedNics(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: bool(c.stored))
        ref = cluster.allocate(DRIVER, devices=["n0"], request="nic")
        await cluster.wait(lambda c: condition(c, ref, "n0") is not None)
        (device,) = cluster.claims[(ref[0], ref[2])].devices
        (status,) = cluster.device_statuses(ref[0], ref[2])
    assert device.share_id
    assert backend.shares[0] == {"n0": device.share_id}  # the hook knows which share it answers for
    assert status["shareID"] == device.share_id  # the API keys a share's status by it
