"""Device release end to end: the stand-in's pod-resources API, the real host, a release hook."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hostfakes import captured_logs, running_host
from waiting import eventually

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.state import Holder
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)

GPU = "example.com/gpu"


class ScrubbingBackend:
    """Four devices; its release hook records each call and waits for ``gate``."""

    def __init__(self) -> None:
        self.released: list[tuple[str, tuple[str, ...]]] = []
        self.gate = threading.Event()
        self.gate.set()

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource(GPU, tuple(Device(f"g{n}") for n in range(4)))]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        self.released.append((resource, device_ids))
        self.gate.wait(10)


@pytest.fixture
def pod_socket(short_tmp: Path) -> Path:
    return short_tmp / "pod-resources" / "kubelet.sock"


async def test_a_released_pod_reaches_the_hook_once_with_the_devices_unhealthy_meanwhile(
    plugin_dir: Path, pod_socket: Path
) -> None:
    backend = ScrubbingBackend()
    async with (
        KubeletStandIn(plugin_dir, pod_resources_socket=pod_socket) as kubelet,
        running_host(plugin_dir, {"scrub": backend}, pod_resources_socket=pod_socket) as host,
    ):
        await kubelet.wait_for_resource(GPU, healthy=4)
        result = await kubelet.allocate(GPU, 2, pod="trainer", namespace="team-a")
        holder = Holder("team-a", "trainer", "main")
        await eventually(
            lambda: host.snapshot().resource(GPU).holders == dict.fromkeys(result.device_ids, holder),
            "the checkpoint change made the host look",
        )
        assert host.release is not None
        await host.release.look()
        await host.release.look()  # held across many looks: never released
        assert backend.released == []
        assert host.snapshot().device_release == "on"

        backend.gate.clear()
        kubelet.release_pod("trainer", namespace="team-a")
        await eventually(lambda: backend.released == [(GPU, result.device_ids)], "release hook called")
        await kubelet.wait_for_resource(GPU, healthy=2)  # the two being scrubbed are Unhealthy
        assert host.snapshot().resource(GPU).releasing == result.device_ids
        backend.gate.set()
        await kubelet.wait_for_resource(GPU, healthy=4)
        await host.release.wait_idle()
        for _ in range(3):
            await host.release.look()
        assert backend.released == [(GPU, result.device_ids)]
        state = host.snapshot().resource(GPU)
        assert (state.releases, state.holders, state.releasing) == (1, {}, ())


async def test_devices_allocated_before_the_host_started_are_released_when_their_pod_ends(
    plugin_dir: Path, pod_socket: Path
) -> None:
    backend = ScrubbingBackend()
    async with KubeletStandIn(plugin_dir, pod_resources_socket=pod_socket) as kubelet:
        async with running_host(plugin_dir, {"scrub": backend}, pod_resources_socket=pod_socket):
            await kubelet.wait_for_resource(GPU, healthy=4)
            result = await kubelet.allocate(GPU, 1, pod="old")
        async with running_host(plugin_dir, {"scrub": backend}, pod_resources_socket=pod_socket) as host:
            await kubelet.wait_for_resource(GPU, healthy=4)
            await eventually(lambda: bool(host.snapshot().resource(GPU).holders), "the first look")
            await kubelet.restart()  # a kubelet restart keeps its assignments: nothing released
            await kubelet.wait_for_resource(GPU, healthy=4)
            assert host.release is not None
            await host.release.look()
            assert backend.released == []
            kubelet.release_pod("old")
            await eventually(lambda: backend.released == [(GPU, result.device_ids)], "release hook called")


async def test_the_host_carries_on_without_a_pod_resources_socket(
    kubelet: KubeletStandIn, plugin_dir: Path, pod_socket: Path
) -> None:
    backend = ScrubbingBackend()
    with captured_logs() as logs:
        async with running_host(plugin_dir, {"scrub": backend}, pod_resources_socket=pod_socket) as host:
            await kubelet.wait_for_resource(GPU, healthy=4)
            await eventually(lambda: host.snapshot().device_release.startswith("paused"), "said")
            assert host.release is not None
            await host.release.look()
            result = await kubelet.allocate(GPU, 2)
            assert result.device_ids
            kubelet.release(GPU)
            await host.release.look()
            assert host.snapshot().resource(GPU).registered
    paused = [e for e in logs if str(e["event"]).startswith("device release paused")]
    assert len(paused) == 1, paused
    assert str(pod_socket) in paused[0]["event"]
    assert backend.released == []


async def test_device_release_off_follows_nothing(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    async with running_host(plugin_dir, {"scrub": ScrubbingBackend()}, device_release=False) as host:
        await kubelet.wait_for_resource(GPU, healthy=4)
        assert host.release is None
        assert host.snapshot().device_release == "off"
