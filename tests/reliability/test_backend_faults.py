"""Backend faults: hooks that raise, hang or answer nonsense, bad device IDs, flapping health."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from faultkit import Ledger, wait_until
from hostfakes import ScriptedBackend, TopologyBackend, captured_logs, running_host, socket_files, widgets

import devicehost
from devicehost import Device, Health, PreferredAllocationRequest, Resource
from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(120)

FAULTY = "example.com/faulty"
GOOD = "good.example.com/fine"
WRONG: dict[str, object] = {
    "devicehost_allocate": {"envs": {}},
    "devicehost_preferred_allocation": 42,
    "devicehost_discover": "not a list",
    "devicehost_health": ["Healthy"],
}


class FaultyBackend(TopologyBackend):
    """Each hook named in ``faults`` raises, hangs (until the test ends) or answers the wrong type."""

    def __init__(self, *resources: Resource) -> None:
        super().__init__(*resources)
        self.faults: dict[str, str] = {}

    def _fault(self, hook: str) -> object:
        fault = self.faults.get(hook)
        if fault == "raise":
            raise RuntimeError(f"{hook} broke")
        if fault == "hang":  # past any hook timeout; bounded so no thread outlives the test long
            self.hang.wait(30) if hook != "devicehost_stop" else time.sleep(2)
        if fault == "wrong":
            return WRONG[hook]
        return None

    @devicehost.hookimpl
    def devicehost_configure(self, settings: dict[str, Any]) -> None:
        self._fault("devicehost_configure")

    @devicehost.hookimpl
    def devicehost_discover(self) -> object:  # type: ignore[override]  # wrong answers on purpose
        return self._fault("devicehost_discover") or super().devicehost_discover()

    @devicehost.hookimpl
    def devicehost_health(self, resource: str) -> object:  # type: ignore[override]
        return self._fault("devicehost_health") or super().devicehost_health(resource)

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        self._fault("devicehost_start")
        super().devicehost_start(resource, notifier)

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        super().devicehost_stop(resource)
        self._fault("devicehost_stop")

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> object:
        return self._fault("devicehost_allocate") or super().devicehost_allocate(resource, device_ids)

    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: PreferredAllocationRequest) -> object:  # type: ignore[override]
        return self._fault("devicehost_preferred_allocation") or super().devicehost_preferred_allocation(
            request
        )

    @devicehost.hookimpl
    def devicehost_pre_start_container(self, device_ids: tuple[str, ...]) -> None:
        self._fault("devicehost_pre_start_container")
        super().devicehost_pre_start_container(device_ids)


def names_backend_and_hook(logs: list[Any], backend: str, hook: str) -> bool:
    """An error line carrying ``backend=`` and naming the hook."""
    return any(
        e["log_level"] == "error"
        and e.get("backend") == backend
        and hook in f"{e.get('hook', '')} {e.get('error', '')}"
        for e in logs
    )


async def good_still_serves(kubelet: KubeletStandIn) -> None:
    await kubelet.wait_for_resource(GOOD, healthy=2)
    response = await kubelet.allocate_ids(GOOD, ["w1"])
    assert dict(response.container_responses[0].envs) == {"IDS": "w1"}
    assert kubelet.registrations(GOOD) == 1


async def call_hook(kubelet: KubeletStandIn, hook: str) -> object:
    """The kubelet call that reaches ``hook``."""
    stub = kubelet.stub(FAULTY)
    if hook == "devicehost_allocate":
        return await kubelet.allocate_ids(FAULTY, ["w0"])
    if hook == "devicehost_preferred_allocation":
        ask = api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=["w0", "w1", "w2"], allocation_size=2
        )
        return await stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(container_requests=[ask]), timeout=5
        )
    return await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["w0"]), timeout=5)


CALL_FAULTS = [
    (hook, fault, code)
    for hook in ("devicehost_allocate", "devicehost_preferred_allocation", "devicehost_pre_start_container")
    for fault, code in (
        ("raise", grpc.StatusCode.UNKNOWN),
        ("hang", grpc.StatusCode.DEADLINE_EXCEEDED),
        ("wrong", grpc.StatusCode.INTERNAL),
    )
    if not (fault == "wrong" and hook == "devicehost_pre_start_container")
]


@pytest.mark.parametrize(("hook", "fault", "code"), CALL_FAULTS)
async def test_failing_call_hook_gets_its_status_and_a_log_line(
    kubelet: KubeletStandIn, plugin_dir: Path, hook: str, fault: str, code: grpc.StatusCode, ledger: Ledger
) -> None:
    """The kubelet gets the status that says what happened; the log names backend and hook."""
    faulty = FaultyBackend(widgets(FAULTY, 3))
    faulty.faults[hook] = fault
    good = ScriptedBackend(widgets(GOOD, 2))
    with captured_logs() as logs:
        async with running_host(plugin_dir, {"faulty": faulty, "good": good}, hook_timeout=0.3):
            await kubelet.wait_for_resource(FAULTY, healthy=3)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call_hook(kubelet, hook)
            assert caught.value.code() == code
            assert f"backend 'faulty' {hook}" in (caught.value.details() or "")
            assert names_backend_and_hook(logs, "faulty", hook)
            await good_still_serves(kubelet)
            assert kubelet.view(FAULTY).connected
    ledger.add("backend faults injected")
    ledger.add("calls failed as they should")


LIFECYCLE_FAULTS = [
    ("devicehost_discover", "raise", "discovery failed, keeping this backend's resources as they are"),
    ("devicehost_discover", "hang", "discovery failed, keeping this backend's resources as they are"),
    ("devicehost_discover", "wrong", "discovery failed, keeping this backend's resources as they are"),
    ("devicehost_start", "raise", "start hook failed, resource not served"),
    ("devicehost_start", "hang", "start hook failed, resource not served"),
    ("devicehost_configure", "raise", "backend settings refused"),
    ("devicehost_configure", "hang", "backend settings refused"),
]


@pytest.mark.parametrize(("hook", "fault", "event"), LIFECYCLE_FAULTS)
async def test_failing_lifecycle_hook_leaves_the_resource_out_and_the_rest_served(
    kubelet: KubeletStandIn, plugin_dir: Path, hook: str, fault: str, event: str, ledger: Ledger
) -> None:
    """The faulty backend's resource is not served, with a log line; the good backend's is."""
    faulty = FaultyBackend(widgets(FAULTY, 3))
    faulty.faults[hook] = fault
    good = ScriptedBackend(widgets(GOOD, 2))
    with captured_logs() as logs:
        async with running_host(plugin_dir, {"faulty": faulty, "good": good}, hook_timeout=0.3) as host:
            await good_still_serves(kubelet)
            await wait_until(lambda: any(e["event"] == event for e in logs), 5, event)
            assert names_backend_and_hook(logs, "faulty", hook)
            assert FAULTY not in host.resources
            assert FAULTY not in kubelet.resources
            assert len(socket_files(plugin_dir)) == 1
    ledger.add("backend faults injected")


@pytest.mark.parametrize("fault", ["raise", "hang", "wrong"])
async def test_failing_health_hook_keeps_the_devices_as_they_were(
    kubelet: KubeletStandIn, plugin_dir: Path, fault: str, ledger: Ledger
) -> None:
    faulty = FaultyBackend(widgets(FAULTY, 3))
    faulty.faults["devicehost_health"] = fault
    good = ScriptedBackend(widgets(GOOD, 2))
    with captured_logs() as logs:
        async with running_host(
            plugin_dir, {"faulty": faulty, "good": good}, hook_timeout=0.2, health_interval=0.05
        ):
            await kubelet.wait_for_resource(FAULTY, healthy=3)
            await wait_until(lambda: names_backend_and_hook(logs, "faulty", "devicehost_health"), 5, "log")
            assert any(e["event"] == "health hook failed" and e["resource"] == FAULTY for e in logs)
            assert kubelet.view(FAULTY).connected
            assert kubelet.allocatable(FAULTY) == 3
            await good_still_serves(kubelet)
    ledger.add("backend faults injected")


@pytest.mark.parametrize("fault", ["raise", "hang"])
async def test_failing_stop_hook_still_withdraws_in_time(
    kubelet: KubeletStandIn, plugin_dir: Path, fault: str, ledger: Ledger
) -> None:
    faulty = FaultyBackend(widgets(FAULTY, 1))
    faulty.faults["devicehost_stop"] = fault
    with captured_logs() as logs:
        started = 0.0
        async with running_host(plugin_dir, {"faulty": faulty}, hook_timeout=0.3):
            await kubelet.wait_for_resource(FAULTY, healthy=1)
            started = time.monotonic()
        assert time.monotonic() - started < 3
    assert socket_files(plugin_dir) == []
    assert faulty.count("devicehost_stop") == 1
    assert names_backend_and_hook(logs, "faulty", "devicehost_stop")
    ledger.add("backend faults injected")


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ((Device("x"), Device("x")), "appears more than once"),
        ((Device("x" * 64),), "more than 63"),
    ],
)
async def test_bad_device_ids_are_refused_from_discovery_and_from_the_notifier(
    kubelet: KubeletStandIn, plugin_dir: Path, devices: tuple[Device, ...], problem: str, ledger: Ledger
) -> None:
    bad = ScriptedBackend(Resource("example.com/bad", devices), widgets(FAULTY, 2))
    with captured_logs() as logs:
        async with running_host(plugin_dir, {"bad": bad}) as host:
            await kubelet.wait_for_resource(FAULTY, healthy=2)
            assert "example.com/bad" not in host.resources
            assert any(e["event"] == "resource refused" and problem in e["problem"] for e in logs)
            bad.notifiers[FAULTY].set_devices(list(devices))
            await wait_until(
                lambda: any(e["event"] == "device list refused, keeping the previous one" for e in logs)
            )
            refused = next(e for e in logs if e["event"] == "device list refused, keeping the previous one")
            assert (refused["backend"], refused["resource"]) == ("bad", FAULTY)
            assert problem in refused["problem"]
            assert [d.id for d in kubelet.view(FAULTY).devices] == ["w0", "w1"]
    ledger.add("backend faults injected", 2)


async def test_health_flapping_a_thousand_times_a_second_is_coalesced(
    kubelet: KubeletStandIn, plugin_dir: Path, ledger: Ledger
) -> None:
    """1000 flips in about a second reach the kubelet as a bounded number of lists; the last wins."""
    flappy = ScriptedBackend(widgets(FAULTY, 4))
    good = ScriptedBackend(widgets(GOOD, 2))
    async with running_host(plugin_dir, {"flappy": flappy, "good": good}):
        await kubelet.wait_for_resource(FAULTY, healthy=4)
        notifier = flappy.notifiers[FAULTY]
        before = len(kubelet.history(FAULTY))

        def flap() -> None:
            for n in range(1000):
                notifier.set_health({"w0": Health.UNHEALTHY if n % 2 == 0 else Health.HEALTHY})
                time.sleep(0.001)
            notifier.set_health({"w0": Health.UNHEALTHY, "w3": Health.UNHEALTHY})

        started = time.monotonic()
        flapper = asyncio.create_task(asyncio.to_thread(flap))
        await good_still_serves(kubelet)  # the loop keeps answering during the flood
        await flapper
        await kubelet.wait_for_resource(FAULTY, healthy=2, total=4)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.1)  # let a late list arrive, if one were coming (counted below)
        lists = len(kubelet.history(FAULTY)) - before
        assert lists <= elapsed / 0.02 + 5, (lists, elapsed)
        last = kubelet.history(FAULTY)[-1].devices
        assert [d.healthy for d in last] == [False, True, True, False]
    ledger.add("health flips pushed", 1001)
    ledger.add("lists the kubelet received for them", lists)


async def test_crashing_notifier_thread_leaves_the_host_serving(
    kubelet: KubeletStandIn, plugin_dir: Path, monkeypatch: pytest.MonkeyPatch, ledger: Ledger
) -> None:
    """A backend thread that pushes bad values and dies: values refused and logged, host unaffected."""
    crashed: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    pusher = ScriptedBackend(widgets(FAULTY, 2))
    good = ScriptedBackend(widgets(GOOD, 2))
    with captured_logs() as logs:
        async with running_host(plugin_dir, {"pusher": pusher, "good": good}):
            await kubelet.wait_for_resource(FAULTY, healthy=2)
            notifier = pusher.notifiers[FAULTY]

            def crash() -> None:
                notifier.set_health({"w0": "Sickly"})  # type: ignore[dict-item]
                notifier.set_health({"w1": Health.UNHEALTHY})
                raise RuntimeError("watcher thread died")

            thread = threading.Thread(target=crash, name="pusher-watch")
            thread.start()
            await asyncio.to_thread(thread.join, 5)
            assert len(crashed) == 1
            assert "watcher thread died" in str(crashed[0])
            await kubelet.wait_for_resource(FAULTY, healthy=1, total=2)
            refused = [e for e in logs if e["event"] == "health update refused"]
            assert refused[0]["backend"] == "pusher"
            assert "Sickly" in refused[0]["problem"]
            notifier.set_health({"w1": Health.HEALTHY})
            await kubelet.wait_for_resource(FAULTY, healthy=2)
            await good_still_serves(kubelet)
    ledger.add("backend faults injected")
