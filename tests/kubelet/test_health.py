"""Health, pushed and polled, both ways: the kubelet's allocatable follows, its capacity stays."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dpharness import Capacity, DpHarness
from hostfakes import ScriptedBackend, running_host, widgets

from devicehost import Health

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(120)]

PUSHED = "example.com/pushed"
POLLED = "example.com/polled"


def allocatable_is(resource: str, count: int, capacity: int = 4) -> Callable[[Capacity], bool]:
    """The kubelet reports ``count`` allocatable of ``capacity``."""
    return lambda r: r.allocatable.get(resource) == count and r.capacity.get(resource) == capacity


async def test_health_flips_both_ways_change_allocatable(kubelet: DpHarness, plugins_dir: Path) -> None:
    pushed, polled = ScriptedBackend(widgets(PUSHED, 4)), ScriptedBackend(widgets(POLLED, 4))
    async with running_host(
        plugins_dir, {"pushed": pushed, "polled": polled}, registration_mode="kubelet", health_interval=0.1
    ):
        assert (await kubelet.wait(PUSHED, 4))[0]
        assert (await kubelet.wait(POLLED, 4))[0]
        pushed.notifiers[PUSHED].set_health({"w1": Health.UNHEALTHY, "w2": Health.UNHEALTHY})
        await kubelet.until(allocatable_is(PUSHED, 2), "2 of 4 pushed widgets unhealthy")
        polled.health = {"w0": Health.UNHEALTHY}
        report: Capacity = await kubelet.until(allocatable_is(POLLED, 3), "1 of 4 polled widgets unhealthy")
        assert report.allocatable[PUSHED] == 2
        refused = await kubelet.allocate("pod-1", PUSHED, 3)
        assert not refused.ok
        assert refused.stage == "allocate", refused
        pushed.notifiers[PUSHED].set_health({"w1": Health.HEALTHY, "w2": Health.HEALTHY})
        polled.health = {"w0": Health.HEALTHY}
        await kubelet.until(allocatable_is(PUSHED, 4), "pushed widgets healthy again")
        await kubelet.until(allocatable_is(POLLED, 4), "polled widgets healthy again")
        allocation = await kubelet.allocate("pod-2", PUSHED, 4)
        assert allocation.ok, allocation.error
