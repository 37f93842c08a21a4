"""Notifier: a backend's news from any thread, applied on the host's loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from waiting import eventually

from devicehost.hookspecs.types import Device, Health
from devicehost.host.serving.notifier import Notifier


class Recorder:
    """The resource's side: what arrived, and on which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []

    def health(self, health: Mapping[str, Health]) -> None:
        self.calls.append(("health", health, threading.get_ident()))

    def devices(self, devices: tuple[Device, ...]) -> None:
        self.calls.append(("devices", devices, threading.get_ident()))

    def rediscover(self) -> None:
        self.calls.append(("rediscover", None, threading.get_ident()))

    def notifier(self, loop: asyncio.AbstractEventLoop) -> Notifier:
        return Notifier(loop, on_health=self.health, on_devices=self.devices, on_rediscover=self.rediscover)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def test_calls_from_another_thread_reach_the_callbacks_on_the_loop_with_copies(
    recorder: Recorder,
) -> None:
    notifier = recorder.notifier(asyncio.get_running_loop())
    health = {"d0": Health.UNHEALTHY}
    devices = [Device("d0"), Device("d1", Health.UNHEALTHY)]
    caller: list[int] = []

    def backend_thread() -> None:
        caller.append(threading.get_ident())
        notifier.set_health(health)
        notifier.set_devices(devices)
        notifier.rediscover()
        health["d0"] = Health.HEALTHY  # the backend reuses its objects
        devices.append(Device("d2"))

    await asyncio.to_thread(backend_thread)
    await eventually(lambda: len(recorder.calls) == 3)

    assert [c[0] for c in recorder.calls] == ["health", "devices", "rediscover"]
    got_health, got_devices = recorder.calls[0][1], recorder.calls[1][1]
    assert type(got_health) is dict
    assert got_health == {"d0": Health.UNHEALTHY}
    assert got_health is not health
    assert type(got_devices) is tuple
    assert got_devices == (Device("d0"), Device("d1", Health.UNHEALTHY))
    loop_thread = threading.get_ident()
    assert caller[0] != loop_thread
    assert {c[2] for c in recorder.calls} == {loop_thread}


async def test_a_call_on_the_loop_is_applied_later_not_inside_the_call(recorder: Recorder) -> None:
    notifier = recorder.notifier(asyncio.get_running_loop())
    notifier.set_health({"d0": Health.HEALTHY})
    assert recorder.calls == []
    await eventually(lambda: len(recorder.calls) == 1)
    assert recorder.calls[0][1] == {"d0": Health.HEALTHY}


async def test_close_drops_every_later_call(recorder: Recorder) -> None:
    loop = asyncio.get_running_loop()
    notifier = recorder.notifier(loop)
    marker = asyncio.Event()

    def backend_thread() -> None:
        notifier.set_health({"d0": Health.HEALTHY})
        notifier.close()
        notifier.set_health({"d0": Health.UNHEALTHY})
        notifier.set_devices([Device("d9")])
        notifier.rediscover()
        loop.call_soon_threadsafe(marker.set)  # posted after them: runs after them

    await asyncio.to_thread(backend_thread)
    await asyncio.wait_for(marker.wait(), 1.0)

    assert [(c[0], c[1]) for c in recorder.calls] == [("health", {"d0": Health.HEALTHY})]


def test_a_closed_loop_does_not_raise(recorder: Recorder) -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    notifier = recorder.notifier(loop)

    notifier.set_health({"d0": Health.HEALTHY})
    notifier.set_devices([Device("d0")])
    notifier.rediscover()

    assert recorder.calls == []
