"""Slow hardware: a resource declares how long its hooks may take (``HookTimeouts``), within what
the kubelet allows; the host bounds each call by it instead of the host-wide ``hook_timeout``,
says it in ``/status``, and a hook past its own bound fails that call alone."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import devicehost
from devicehost import ContainerAllocation, Device, Health, HookTimeouts, Resource
from devicehost.hookspecs import rules
from devicehost.host.backends.backend import Backend, HookTimeout
from devicehost.host.ops.status import document
from devicehost.standin import KubeletStandIn
from devicehost.testing.host import running_host

pytestmark = pytest.mark.timeout(60)

HOST_TIMEOUT = 0.3
"""The host-wide ``hook_timeout`` of these tests: every slow hook below takes longer."""
FPGA = "slow.example.com/fpga"
"""Declares 2 s for each hook; its hooks take 0.6 s (a bitstream loading)."""
LATE = "slow.example.com/late"
"""Declares 0.5 s for allocate; its allocate takes until the test ends."""
FAST = "slow.example.com/fast"
"""Declares nothing: the host's 0.3 s."""


class SlowHardware:
    """Hooks as slow as hardware that repartitions or loads a bitstream."""

    def __init__(self) -> None:
        self.done = threading.Event()
        """Set at the end of a test: hooks still waiting return."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        slow = HookTimeouts(allocate=2.0, release=2.0, health=2.0)
        return [
            Resource(FPGA, (Device("fpga-0"), Device("fpga-1")), hook_timeouts=slow),
            Resource(LATE, (Device("late-0"),), hook_timeouts=HookTimeouts(allocate=0.5)),
            Resource(FAST, (Device("fast-0"),)),
        ]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        if resource == FPGA:
            time.sleep(0.6)
        elif resource == LATE:
            self.done.wait(30)
        return ContainerAllocation(envs={"DEVICES": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        time.sleep(0.6)

    @devicehost.hookimpl
    def devicehost_health(self, resource: str, devices: tuple[Device, ...]) -> dict[str, Health]:
        time.sleep(0.6)
        return {d.id: Health.HEALTHY for d in devices}


@pytest.fixture
def hardware() -> Iterator[SlowHardware]:
    plugin = SlowHardware()
    yield plugin
    plugin.done.set()


async def test_each_hook_takes_the_seconds_its_resource_declared(hardware: SlowHardware) -> None:
    backend = Backend("slow", hardware, hook_timeout=HOST_TIMEOUT)
    try:
        await backend.discover()
        assert backend.resource_timeouts(FPGA) == {"allocate": 2.0, "release": 2.0, "health": 2.0}
        assert backend.resource_timeouts(LATE) == {
            "allocate": 0.5,
            "release": HOST_TIMEOUT,
            "health": HOST_TIMEOUT,
        }
        answer = await backend.allocate(FPGA, ("fpga-0",))  # 0.6 s: past the host's 0.3 s, within 2 s
        assert answer.envs == {"DEVICES": "fpga-0"}
        await backend.release(FPGA, ("fpga-0",))
        assert await backend.health(FPGA, (Device("fpga-0"),)) == {"fpga-0": Health.HEALTHY}
        with pytest.raises(HookTimeout) as late:
            await backend.allocate(LATE, ("late-0",))
        assert str(late.value) == "backend 'slow' devicehost_allocate did not return within 0.5 s"
        with pytest.raises(HookTimeout, match=r"devicehost_release did not return within 0\.3 s"):
            await backend.release(LATE, ("late-0",))  # LATE declared no release bound: the host's
        assert backend.stuck_hooks() == ["devicehost_allocate", "devicehost_release"]
    finally:
        hardware.done.set()
        backend.close()


async def test_a_slow_allocate_within_its_bound_reaches_the_kubelet_and_one_past_it_fails_alone(
    hardware: SlowHardware,
) -> None:
    with tempfile.TemporaryDirectory(prefix="slow-", dir="/tmp") as tmp:  # short socket paths
        dp = Path(tmp) / "dp"
        dp.mkdir()
        async with (
            KubeletStandIn(dp) as kubelet,
            running_host(dp, {"slow": hardware}, hook_timeout=HOST_TIMEOUT, device_release=False) as host,
        ):
            await kubelet.wait_for_resource(FPGA, healthy=2)
            await kubelet.wait_for_resource(LATE, healthy=1)
            await kubelet.wait_for_resource(FAST, healthy=1)
            given = await kubelet.allocate(FPGA, device_ids=["fpga-1"])
            assert given.response.container_responses[0].envs == {"DEVICES": "fpga-1"}
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await kubelet.allocate_ids(LATE, ["late-0"])
            assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert late.value.details() == "backend 'slow' devicehost_allocate did not return within 0.5 s"
            fast = await kubelet.allocate(FAST, device_ids=["fast-0"])  # the others are untouched
            assert fast.response.container_responses[0].envs == {"DEVICES": "fast-0"}
            resources = document(host.snapshot())["resources"]
            assert resources[FPGA]["hook_timeouts"] == {"allocate": 2.0, "release": 2.0, "health": 2.0}
            assert resources[FAST]["hook_timeouts"] == {
                "allocate": HOST_TIMEOUT,
                "release": HOST_TIMEOUT,
                "health": HOST_TIMEOUT,
            }


@pytest.mark.parametrize(
    ("timeouts", "problem"),
    [
        (
            HookTimeouts(allocate=46),
            "hook_timeouts.allocate 46 must be a number of seconds above 0 and at most 45",
        ),
        (
            HookTimeouts(health=31.0),
            "hook_timeouts.health 31.0 must be a number of seconds above 0 and at most 30",
        ),
        (
            HookTimeouts(release=0),
            "hook_timeouts.release 0 must be a number of seconds above 0 and at most 45",
        ),
        (HookTimeouts(release=True), "hook_timeouts.release True must be a number of seconds"),
        ({"allocate": 40}, "hook_timeouts must be a devicehost.HookTimeouts, got {'allocate': 40}"),
    ],
)
def test_a_bound_past_what_the_kubelet_allows_is_refused_at_discovery(timeouts: object, problem: str) -> None:
    resource = Resource(FPGA, (Device("fpga-0"),), hook_timeouts=timeouts)  # type: ignore[arg-type]
    found = rules.discovery_problem([resource])
    assert found is not None
    assert found.startswith(f"{FPGA}: {problem}"), found


def test_the_limits_are_the_kubelets() -> None:
    assert rules.HOOK_TIMEOUT_LIMITS == {"allocate": 45.0, "release": 45.0, "health": 30.0}
    assert (
        rules.discovery_problem([Resource(FPGA, hook_timeouts=HookTimeouts(allocate=45, health=30))]) is None
    )
