"""Faults as the real kubelet sees them: hooks that raise or hang, a lost socket, an ended stream."""

from __future__ import annotations

from pathlib import Path

import pytest
from dpharness import DpHarness
from hostfakes import ScriptedBackend, running_host, socket_files, widgets

from devicehost import Health
from devicehost.proto.deviceplugin.v1beta1 import api_pb2

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(120)]

RAISING, HANGING, GOOD = "example.com/raising", "example.com/hanging", "example.com/good"
HOOK_TIMEOUT = 1.0


async def test_raising_and_hanging_allocate_hooks_fail_admission_and_nothing_else(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    raising, hanging = ScriptedBackend(widgets(RAISING, 2)), ScriptedBackend(widgets(HANGING, 2))
    raising.allocate_error = RuntimeError("widget driver broke")
    hanging.hanging = {"devicehost_allocate"}
    good = ScriptedBackend(widgets(GOOD, 2))
    backends = {"raising": raising, "hanging": hanging, "good": good}
    async with running_host(plugins_dir, backends, registration_mode="kubelet", hook_timeout=HOOK_TIMEOUT):
        for name in (RAISING, HANGING, GOOD):
            assert (await kubelet.wait(name, 2))[0], name
        raised = await kubelet.allocate("pod-r", RAISING, 1)
        assert not raised.ok
        assert raised.stage == "allocate"
        assert "widget driver broke" in raised.error
        hung = await kubelet.allocate("pod-h", HANGING, 1)
        assert not hung.ok
        assert hung.stage == "allocate"
        assert "DeadlineExceeded" in hung.error or "deadline" in hung.error.lower(), hung.error
        fine = await kubelet.allocate("pod-g", GOOD, 2)
        assert fine.ok, fine.error
        report = await kubelet.capacity()
    assert report.allocatable == {RAISING: 2, HANGING: 2, GOOD: 2}, "a failed admission freed its devices"


async def test_the_host_serves_and_registers_again_when_its_socket_is_removed(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    backend = ScriptedBackend(widgets(GOOD, 3))
    async with running_host(plugins_dir, {"good": backend}, registration_mode="kubelet") as host:
        assert (await kubelet.wait(GOOD, 3))[0]
        (first,) = socket_files(plugins_dir)
        (plugins_dir / first).unlink()
        await kubelet.until(lambda _: socket_files(plugins_dir) == [first], "our socket served again")
        await kubelet.until(
            lambda r: r.allocatable.get(GOOD) == 3 and host.snapshot().resource(GOOD).registration_count == 2,
            "registered again",
        )
        allocation = await kubelet.allocate("pod-1", GOOD, 3)
    assert allocation.ok, allocation.error
    assert backend.count("devicehost_allocate", GOOD) == 1


async def test_an_ended_list_and_watch_stream_is_noticed_and_registered_again(
    kubelet: DpHarness, plugins_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = ScriptedBackend(widgets(GOOD, 3))
    async with running_host(plugins_dir, {"good": backend}, registration_mode="kubelet") as host:
        assert (await kubelet.wait(GOOD, 3))[0]
        table = host.resources[GOOD].table
        real_message = table.message

        def broken_once() -> api_pb2.ListAndWatchResponse:
            monkeypatch.setattr(table, "message", real_message)
            raise RuntimeError("the stream's handler failed")

        monkeypatch.setattr(table, "message", broken_once)
        host.resources[GOOD].apply_health({"w0": Health.UNHEALTHY})  # the stream wakes up and fails
        await kubelet.until(
            lambda r: r.allocatable.get(GOOD) == 2 and host.snapshot().resource(GOOD).registration_count == 2,
            "registered again after the stream ended, with the news it failed to send",
        )
        host.resources[GOOD].apply_health({"w0": Health.HEALTHY})
        await kubelet.until(lambda r: r.allocatable.get(GOOD) == 3, "the new stream carries health")
        allocation = await kubelet.allocate("pod-1", GOOD, 1)
    assert allocation.ok, allocation.error
    log = (plugins_dir.parent / f"{plugins_dir.name}-dpharness.log").read_text()
    assert "ListAndWatch ended unexpectedly" in log
