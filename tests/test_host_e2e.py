"""The host end to end: real Host, real grpc.aio servers on unix sockets, the kubelet stand-in."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

import grpc
import pytest
from hostfakes import ScriptedBackend, TopologyBackend, running_host, socket_files, widgets
from waiting import eventually

import devicehost
from devicehost import Device, Health, Resource
from devicehost.testing.kubelet import EventKind, KubeletStandIn

pytestmark = pytest.mark.timeout(60)


async def test_resources_of_two_backends_register_and_serve(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    alpha = ScriptedBackend(widgets("alpha.example.com/a", 4), widgets("alpha.example.com/b", 2))
    beta = TopologyBackend(widgets("beta.example.com/c", 3))
    async with running_host(plugin_dir, {"alpha": alpha, "beta": beta}):
        for name, count in (
            ("alpha.example.com/a", 4),
            ("alpha.example.com/b", 2),
            ("beta.example.com/c", 3),
        ):
            view = await kubelet.wait_for_resource(name, healthy=count)
            assert view.registrations == 1
        assert kubelet.options("alpha.example.com/a").get_preferred_allocation_available is False
        assert kubelet.options("alpha.example.com/a").pre_start_required is False
        assert kubelet.options("beta.example.com/c").get_preferred_allocation_available is True
        assert kubelet.options("beta.example.com/c").pre_start_required is True
        assert kubelet.view("beta.example.com/c").devices[1].numa_nodes == (1,)
        sockets = socket_files(plugin_dir)
        assert len(sockets) == 3
        assert all(stat.S_IMODE(os.stat(plugin_dir / s).st_mode) == 0o600 for s in sockets)
        assert alpha.count("devicehost_start") == 2
    assert socket_files(plugin_dir) == []
    assert alpha.count("devicehost_stop") == 2
    assert beta.count("devicehost_stop", "beta.example.com/c") == 1


async def test_allocation_reaches_the_kubelet(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = TopologyBackend(widgets("example.com/gpu", 4))
    async with running_host(plugin_dir, {"topo": backend}):
        await kubelet.wait_for_resource("example.com/gpu", healthy=4)
        result = await kubelet.allocate("example.com/gpu", 2)
        assert result.preferred == ("w0", "w1")
        assert result.device_ids == ("w0", "w1")
        container = result.response.container_responses[0]
        assert dict(container.envs) == {"IDS": "w0,w1"}
        assert [d.container_path for d in container.devices] == ["/dev/w0", "/dev/w1"]
        assert result.pre_started
        assert backend.pre_started == [("w0", "w1")]


async def test_unknown_device_ids_are_invalid_argument(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    async with running_host(plugin_dir, {"b": backend}):
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate_ids("example.com/widget", ["w0", "nope", "w9"])
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'nope', 'w9'" in (caught.value.details() or "")
        assert backend.count("devicehost_allocate") == 0


async def test_raising_hook_is_reported_and_the_host_keeps_serving(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    backend.allocate_error = RuntimeError("driver says no")
    async with running_host(plugin_dir, {"flaky": backend}):
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate_ids("example.com/widget", ["w0"])
        assert caught.value.code() == grpc.StatusCode.UNKNOWN
        assert caught.value.details() == (
            "backend 'flaky' devicehost_allocate raised RuntimeError: driver says no"
        )
        backend.allocate_error = None
        response = await kubelet.allocate_ids("example.com/widget", ["w1"])
        assert dict(response.container_responses[0].envs) == {"IDS": "w1"}


async def test_hanging_hook_gets_deadline_exceeded_not_a_stuck_kubelet(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    other = ScriptedBackend(widgets("other.example.com/thing", 1))
    backend.hanging.add("devicehost_allocate")
    async with running_host(plugin_dir, {"stuck": backend, "other": other}, hook_timeout=0.3):
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        await kubelet.wait_for_resource("other.example.com/thing", healthy=1)
        started = asyncio.get_running_loop().time()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate_ids("example.com/widget", ["w0"], timeout=5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "did not return within 0.3 s" in (caught.value.details() or "")
        assert asyncio.get_running_loop().time() - started < 2
        response = await kubelet.allocate_ids("other.example.com/thing", ["w0"])
        assert dict(response.container_responses[0].envs) == {"IDS": "w0"}


async def test_wrong_answer_from_allocate_is_internal(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 1))
    backend.allocate_answer = {"envs": {}}
    async with running_host(plugin_dir, {"sloppy": backend}):
        await kubelet.wait_for_resource("example.com/widget", healthy=1)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.allocate_ids("example.com/widget", ["w0"])
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert "returned dict, expected ContainerAllocation" in (caught.value.details() or "")


async def test_pushed_health_reaches_the_kubelet_both_ways(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 3))
    async with running_host(plugin_dir, {"push": backend}):
        await kubelet.wait_for_resource("example.com/widget", healthy=3)
        notifier = backend.notifiers["example.com/widget"]
        await asyncio.to_thread(notifier.set_health, {"w1": Health.UNHEALTHY})
        await kubelet.wait_for_resource("example.com/widget", healthy=2, total=3)
        assert kubelet.unhealthy("example.com/widget") == 1
        notifier.set_health({"w1": Health.HEALTHY})
        await kubelet.wait_for_resource("example.com/widget", healthy=3)
        notifier.set_devices([Device("w0"), Device("w7", Health.UNHEALTHY)])
        view = await kubelet.wait_for_resource("example.com/widget", healthy=1, total=2)
        assert [d.id for d in view.devices] == ["w0", "w7"]


async def test_polled_health_reaches_the_kubelet_both_ways(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    async with running_host(plugin_dir, {"poll": backend}, health_interval=0.05):
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        backend.health = {"w0": Health.UNHEALTHY}
        await kubelet.wait_for_resource("example.com/widget", healthy=1, total=2)
        backend.health = {"w0": Health.HEALTHY}
        await kubelet.wait_for_resource("example.com/widget", healthy=2, total=2)


async def test_kubelet_restarts_twenty_times_and_every_resource_comes_back(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2), widgets("example.com/b", 3))
    async with running_host(plugin_dir, {"b": backend}) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        await kubelet.wait_for_resource("example.com/b", healthy=3)
        for round_ in range(20):
            await kubelet.restart()
            await kubelet.wait_for_resource("example.com/a", healthy=2)
            await kubelet.wait_for_resource("example.com/b", healthy=3)
            # exactly one registration per kubelet start: none lost, none doubled
            assert kubelet.registrations("example.com/a") == round_ + 2
            assert kubelet.registrations("example.com/b") == round_ + 2
            assert len(socket_files(plugin_dir)) == 2
        assert host.snapshot().resource("example.com/a").registration_count == 21
        result = await kubelet.allocate("example.com/b", 1)
        assert result.device_ids == ("w0",)


async def test_dropped_stream_registers_again(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2), widgets("example.com/b", 1))
    async with running_host(plugin_dir, {"b": backend}) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        await kubelet.wait_for_resource("example.com/b", healthy=1)
        since = len(kubelet.events)
        kubelet.drop_stream("example.com/a")
        await kubelet.wait_for_event(EventKind.DISCONNECTED, "example.com/a", since=since)
        await kubelet.wait_for_event(EventKind.REGISTERED, "example.com/a", since=since)
        view = await kubelet.wait_for_resource("example.com/a", healthy=2)
        assert view.registrations == 2
        assert host.snapshot().resource("example.com/b").registration_count == 1
        assert kubelet.registrations("example.com/b") == 1


async def test_rediscovery_withdraws_and_adds_resources(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2), widgets("example.com/b", 1))
    async with running_host(plugin_dir, {"b": backend}, rediscover_interval=0.1) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        await kubelet.wait_for_resource("example.com/b", healthy=1)
        b_socket = host.resources["example.com/b"].socket.name
        backend.resources = [widgets("example.com/b", 1), widgets("example.com/c", 5)]
        await kubelet.wait_for_resource("example.com/c", healthy=5)
        await kubelet.wait_for_event(EventKind.DISCONNECTED, "example.com/a", since=0)
        assert "example.com/a" not in host.resources
        assert backend.count("devicehost_stop", "example.com/a") == 1
        assert host.resources["example.com/b"].socket.name == b_socket
        assert kubelet.registrations("example.com/b") == 1
        assert len(socket_files(plugin_dir)) == 2


async def test_failed_discovery_keeps_what_the_backend_had(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2))
    async with running_host(plugin_dir, {"b": backend}, rediscover_interval=0.05) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        backend.discover_error = OSError("bus error")
        discoveries = host.discoveries
        await eventually(lambda: host.discoveries >= discoveries + 3, "three failed discoveries")
        assert "example.com/a" in host.resources
        assert kubelet.allocatable("example.com/a") == 2


async def test_invalid_resources_are_refused_and_the_rest_served(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    backend = ScriptedBackend(
        widgets("kubernetes.io/sneaky", 1),
        Resource("example.com/dupes", (Device("x"), Device("x"))),
        Resource("example.com/long", (Device("x" * 64),)),
        widgets("example.com/fine", 2),
    )
    rival = ScriptedBackend(widgets("example.com/fine", 9))
    async with running_host(plugin_dir, {"b": backend, "rival": rival}) as host:
        await kubelet.wait_for_resource("example.com/fine")
        assert sorted(host.resources) == ["example.com/fine"]
        # Discoveries run at once and the first answer is served: the other offer is refused.
        owner = host.resources["example.com/fine"].backend.name
        expected = {"b": 2, "rival": 9}[owner]
        await kubelet.wait_for_resource("example.com/fine", healthy=expected)
        loser = rival if owner == "b" else backend
        assert loser.count("devicehost_start", "example.com/fine") == 0


async def test_kubelet_absent_at_start_then_appearing(plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2))
    async with running_host(plugin_dir, {"b": backend}) as host:
        await eventually(lambda: host.discoveries > 0 and "example.com/a" in host.resources, "served")
        assert len(socket_files(plugin_dir)) == 1
        async with KubeletStandIn(plugin_dir) as late:
            view = await late.wait_for_resource("example.com/a", healthy=2, timeout=5)
            assert view.registrations == 1


async def test_rediscovery_does_not_undo_pushed_health(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    async with running_host(plugin_dir, {"push": backend}, rediscover_interval=0.05) as host:
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        backend.notifiers["example.com/widget"].set_health({"w0": Health.UNHEALTHY})
        await kubelet.wait_for_resource("example.com/widget", healthy=1)
        discoveries = host.discoveries
        # discovery keeps saying w0 is Healthy, as before
        await eventually(lambda: host.discoveries >= discoveries + 3, "three more discoveries")
        assert kubelet.allocatable("example.com/widget") == 1
        # a change in what discovery reports does count (w1), an unchanged report does not (w0)
        backend.resources = [Resource("example.com/widget", (Device("w0"), Device("w1", Health.UNHEALTHY)))]
        view = await kubelet.wait_for_resource("example.com/widget", healthy=0, total=2)
        assert [(d.id, d.health) for d in view.devices] == [("w0", "Unhealthy"), ("w1", "Unhealthy")]


class SlowDiscovery(ScriptedBackend):
    """Its discovery blocks until the test lets it answer."""

    def __init__(self, *resources: Resource) -> None:
        super().__init__(*resources)
        self.answer = threading.Event()

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        self.answer.wait(30)
        return super().devicehost_discover()


async def test_a_slow_discovery_holds_back_no_other_backends_resources(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    slow = SlowDiscovery(widgets("slow.example.com/a", 1))
    fast = ScriptedBackend(widgets("fast.example.com/b", 2))
    async with running_host(plugin_dir, {"slow": slow, "fast": fast}, hook_timeout=30.0):
        view = await kubelet.wait_for_resource("fast.example.com/b", healthy=2)
        assert view.registrations == 1
        assert kubelet.registrations("slow.example.com/a") == 0, "the slow backend has not answered yet"
        slow.answer.set()
        await kubelet.wait_for_resource("slow.example.com/a", healthy=1)
        assert kubelet.view("fast.example.com/b").registrations == 1, "the fast one was left alone"
