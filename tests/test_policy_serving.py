"""The host answers GetPreferredAllocation with a configured policy when the backend has no hook."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostfakes import ScriptedBackend, TopologyBackend, running_host, widgets

from devicehost import Device, Resource
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)

GPU = "example.com/gpu"
REPLICAS = Resource(GPU, tuple(Device(f"g{n}", numa_nodes=(n // 4,), group=f"gpu{n // 2}") for n in range(8)))


@pytest.mark.parametrize(
    ("policy", "chosen"),
    [
        ("numa-pack", ("g0", "g1", "g2")),
        ("spread", ("g0", "g4", "g2")),
        ("replica-spread", ("g0", "g2", "g4")),
    ],
)
async def test_a_configured_policy_answers_for_a_backend_without_the_hook(
    kubelet: KubeletStandIn, plugin_dir: Path, policy: str, chosen: tuple[str, ...]
) -> None:
    backend = ScriptedBackend(REPLICAS)
    async with running_host(plugin_dir, {"plain": backend}, preferred_allocation={GPU: policy}):
        await kubelet.wait_for_resource(GPU, healthy=8)
        assert kubelet.options(GPU).get_preferred_allocation_available
        result = await kubelet.allocate(GPU, 3)
        assert result.preferred == chosen
        assert result.device_ids == chosen


async def test_without_a_policy_nothing_is_advertised(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    async with running_host(
        plugin_dir, {"plain": ScriptedBackend(REPLICAS)}, preferred_allocation={GPU: "none"}
    ):
        await kubelet.wait_for_resource(GPU, healthy=8)
        assert not kubelet.options(GPU).get_preferred_allocation_available
        assert (await kubelet.allocate(GPU, 1)).preferred is None


async def test_the_backends_own_hook_wins_over_a_policy(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = TopologyBackend(widgets(GPU, 4))
    async with running_host(plugin_dir, {"topo": backend}, preferred_allocation={GPU: "spread"}):
        await kubelet.wait_for_resource(GPU, healthy=4)
        assert (await kubelet.allocate(GPU, 2)).preferred == ("w0", "w1")
        assert backend.count("devicehost_preferred_allocation") == 1


async def test_a_policy_for_a_resource_nobody_serves_is_warned_about_once(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    from hostfakes import captured_logs

    policies = {GPU: "spread", "example.com/nothere": "spread"}
    with captured_logs() as lines:
        async with running_host(
            plugin_dir, {"plain": ScriptedBackend(REPLICAS)}, preferred_allocation=policies
        ) as host:
            await kubelet.wait_for_resource(GPU, healthy=8)
            await host.reconcile()
            await host.reconcile()
    warned = [line for line in lines if line["event"].startswith("preferred_allocation names resources")]
    assert len(warned) == 1
    assert warned[0]["resources"] == ["example.com/nothere"]
    assert warned[0]["served"] == [GPU]
