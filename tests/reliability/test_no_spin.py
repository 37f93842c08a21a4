"""No input makes the host spin: bad run-time answers are refused at the boundary, and a resource
that keeps failing backs off on its own, over real sockets against the stand-in."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hostfakes import ScriptedBackend, captured_logs, running_host, widgets
from waiting import eventually

from devicehost import Device, Health, Resource
from devicehost.host.serving import kubelet_registrar
from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)

BAD = "bad.example.com/widget"
GOOD = "example.com/widget"
WINDOW = 3.0
"""Seconds over which Register calls are counted: today's host made hundreds in it."""


def count_registers(kubelet: KubeletStandIn) -> Counter[str]:
    """Count every Register call the stand-in answers, by resource name (wrap before it starts)."""
    calls: Counter[str] = Counter()
    original: Callable[[api_pb2.RegisterRequest], Awaitable[str | None]] = kubelet._register

    async def counted(request: api_pb2.RegisterRequest) -> str | None:
        calls[request.resource_name] += 1
        return await original(request)

    kubelet._register = counted  # type: ignore[method-assign]
    return calls


async def registers_over(calls: Counter[str], name: str, seconds: float, most: int) -> int:
    """Watch ``calls[name]`` for ``seconds``, failing as soon as it passes ``most``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert calls[name] <= most, f"{calls[name]} Register calls for {name} within {seconds} s"
        await asyncio.sleep(0.01)
    return calls[name]


def smuggled(device_id: str, health: object) -> Device:
    """A ``Device`` carrying a health its constructor would refuse, as a backend that builds
    devices by hand (``object.__setattr__``, a subclass, a copy) can still hand over."""
    device = Device(device_id)
    object.__setattr__(device, "health", health)
    return device


async def test_a_plain_string_health_from_discovery_is_refused_and_nothing_spins(
    plugin_dir: Path,
) -> None:
    bad = ScriptedBackend(Resource(BAD, (smuggled("b0", "healthy"), Device("b1"))))
    good = ScriptedBackend(widgets(GOOD, 2))
    kubelet = KubeletStandIn(plugin_dir)
    calls = count_registers(kubelet)
    async with kubelet:
        with captured_logs() as logs:
            async with running_host(plugin_dir, {"bad": bad, "good": good}) as host:
                await kubelet.wait_for_resource(GOOD, healthy=2)
                assert await registers_over(calls, BAD, WINDOW, most=0) == 0
                assert calls[GOOD] == 1
                assert BAD not in host.resources
    refused = [e for e in logs if e["event"] == "resource refused" and e["resource"] == BAD]
    assert refused, "the refusal was not logged"
    assert refused[0]["backend"] == "bad"
    assert refused[0]["hook"] == "devicehost_discover"
    assert "device 'b0': health 'healthy' is not a devicehost.Health" in refused[0]["problem"]


async def test_bad_notifier_and_health_hook_answers_keep_the_last_good_state(plugin_dir: Path) -> None:
    backend = ScriptedBackend(widgets(GOOD, 2))
    kubelet = KubeletStandIn(plugin_dir)
    calls = count_registers(kubelet)
    with captured_logs() as logs:
        async with kubelet, running_host(plugin_dir, {"ex": backend}, health_interval=0.02) as host:
            await kubelet.wait_for_resource(GOOD, healthy=2)
            notifier = backend.notifiers[GOOD]
            notifier.set_devices([smuggled("w0", "healthy"), Device("w9")])
            notifier.set_devices([Device("w0", numa_nodes=(-1,))])
            notifier.set_health({"w1": "unhealthy"})  # type: ignore[dict-item]
            backend.health = {"w0": "sick"}  # type: ignore[dict-item]
            await eventually(lambda: backend.count("devicehost_health", GOOD) >= 3, "health polled")
            backend.health = None
            notifier.set_health({"w1": Health.UNHEALTHY})  # after the bad ones: they were handled
            await kubelet.wait_for_resource(GOOD, healthy=1)
            assert [d.id for d in host.resources[GOOD].table.devices] == ["w0", "w1"]
            assert kubelet.view(GOOD).connected
            assert calls[GOOD] == 1, "the stream broke and the host registered again"
    refusals = [(e["hook"], e["problem"]) for e in logs if "refused" in e["event"]]
    assert ("notifier.set_devices", "device 'w0': health 'healthy' is not a devicehost.Health") in refusals
    assert (
        "notifier.set_devices",
        "device 'w0': numa_nodes (-1,) must be a sequence of non-negative ints",
    ) in refusals
    assert ("notifier.set_health", "device 'w1': health 'unhealthy' is not a devicehost.Health") in refusals
    hook_errors = [e["error"] for e in logs if e["event"] == "health hook failed"]
    assert hook_errors
    assert hook_errors[0] == (
        "backend 'ex' devicehost_health answer refused: device 'w0': health 'sick' is not a devicehost.Health"
    )
    assert all(
        e.get("backend") == "ex" and e.get("resource") == GOOD for e in logs if "refused" in e["event"]
    )


async def test_a_stream_that_keeps_ending_backs_off_and_other_resources_are_untouched(
    plugin_dir: Path,
) -> None:
    flaky = ScriptedBackend(widgets(BAD, 1))
    steady = ScriptedBackend(widgets(GOOD, 1))
    kubelet = KubeletStandIn(plugin_dir)
    calls = count_registers(kubelet)
    original = kubelet._register

    drops: set[asyncio.Task[None]] = set()

    async def drop_once_streaming() -> None:
        await kubelet.wait_for_resource(BAD, healthy=1)
        kubelet.drop_stream(BAD)

    async def drop_after_register(request: api_pb2.RegisterRequest) -> str | None:
        error = await original(request)
        if request.resource_name == BAD and error is None:
            drops.add(asyncio.create_task(drop_once_streaming()))
        return error

    kubelet._register = drop_after_register  # type: ignore[method-assign]
    with captured_logs() as logs:
        async with kubelet, running_host(plugin_dir, {"flaky": flaky, "steady": steady}):
            await kubelet.wait_for_resource(GOOD, healthy=1)
            # backoff from 0.02 s doubling, jittered down to half: at most 10 tries fit in 3 s
            registers = await registers_over(calls, BAD, WINDOW, most=10)
            assert registers >= 3, "the host stopped trying"
            assert calls[GOOD] == 1
            assert kubelet.view(GOOD).connected
    backing_off = [e for e in logs if e["event"].startswith("the kubelet keeps ending the stream")]
    assert len(backing_off) == 1, "logged once per change, not once per try"
    assert backing_off[0]["resource"] == BAD


@pytest.mark.parametrize("held", ["briefly", "long"])
async def test_a_stream_the_kubelet_drops_is_registered_again_at_once(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """A rolling update on kubelet 1.35: the old pod stops, the kubelet drops the new pod's stream."""
    monkeypatch.setattr(kubelet_registrar, "STABLE_AFTER", 60.0 if held == "briefly" else 0.0)
    backend = ScriptedBackend(widgets(GOOD, 2))
    kubelet = KubeletStandIn(plugin_dir)
    calls = count_registers(kubelet)
    async with kubelet, running_host(plugin_dir, {"ex": backend}):
        await kubelet.wait_for_resource(GOOD, healthy=2)
        started = time.monotonic()
        kubelet.drop_stream(GOOD)
        await eventually(lambda: calls[GOOD] == 2, "registered again")
        await kubelet.wait_for_resource(GOOD, healthy=2)
        assert time.monotonic() - started < 0.25


async def test_a_new_kubelet_still_starting_is_retried_within_milliseconds(plugin_dir: Path) -> None:
    """Tries against a stopped kubelet grow the delay; the new kubelet.sock resets it (issue 17)."""
    kubelet = KubeletStandIn(plugin_dir)
    refuse = [0]
    original = kubelet._register

    async def starting(request: api_pb2.RegisterRequest) -> str | None:
        if refuse[0] > 0:
            refuse[0] -= 1
            return "the kubelet is still starting"
        return await original(request)

    kubelet._register = starting  # type: ignore[method-assign]
    backend = ScriptedBackend(widgets(GOOD, 1))
    async with kubelet, running_host(plugin_dir, {"ex": backend}) as host:
        await kubelet.wait_for_resource(GOOD, healthy=1)
        stats = host.resources[GOOD].registrar.stats
        await kubelet.stop()
        with socket.socket(socket.AF_UNIX) as stale:  # a kubelet.sock nobody answers on
            stale.bind(str(kubelet.socket_path))
            await eventually(lambda: stats.failed_tries >= 7, "the delay grew past 0.3 s")
            refuse[0] = 2
            started = time.monotonic()
            await kubelet.start()
        await kubelet.wait_for_resource(GOOD, healthy=1)
        assert time.monotonic() - started < 0.3, "waited out the delay grown against the old kubelet"
