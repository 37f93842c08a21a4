"""Kubelet restarts, as the real device manager does them: every resource back, allocations kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpharness import DpHarness

from devicehost.testing import running_host

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(240)]

RESOURCES = {"example.com/widget": 4, "example.com/gadget": 2}
RESTARTS = 20


async def test_twenty_kubelet_restarts_bring_every_resource_back(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    settings = {"example": {"resources": RESOURCES}}
    async with running_host(plugins_dir, ["example"], registration_mode="kubelet", backends=settings) as host:
        for name, count in RESOURCES.items():
            assert (await kubelet.wait(name, count))[0], name
        held = await kubelet.allocate("held", "example.com/widget", 2)
        assert held.ok, held.error
        for n in range(RESTARTS):
            await kubelet.restart()
            for name, count in RESOURCES.items():
                reached, seen, _ = await kubelet.wait(name, count)
                assert reached, f"restart {n + 1}: {name} allocatable {seen} of {count}"
        report = await kubelet.capacity()
        assert report.capacity == RESOURCES
        assert report.allocatable == RESOURCES
        assert sum(r.registration_count for r in host.snapshot().resources) == len(RESOURCES) * (RESTARTS + 1)
        # the held pod kept its two widgets through every restart: only the other two are left
        after = await kubelet.allocate("after", "example.com/widget", 2)
        assert after.ok, after.error
        assert not set(after.device_ids) & set(held.device_ids)
        assert not (await kubelet.allocate("one-more", "example.com/widget", 1)).ok
        gadgets = await kubelet.allocate("gadgets", "example.com/gadget", 2)
        assert gadgets.ok, gadgets.error
