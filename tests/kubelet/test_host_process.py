"""``devicehost run`` as a process against the real kubelet: SIGTERM, a rolling update, a restart."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from cdi_guard import child_environ
from dpharness import DpHarness
from hostfakes import socket_files

from devicehost.testing import HostProcess, host_process

pytestmark = [pytest.mark.kubelet, pytest.mark.timeout(180)]

WIDGET = "example.com/widget"


def example_env(widgets: int) -> Mapping[str, str]:
    """The child's environment: the example backend with ``widgets`` widgets."""
    clean = child_environ()
    return {
        **clean,
        "DEVICEHOST_EXAMPLE_RESOURCES": f"{WIDGET}={widgets}",
        "DEVICEHOST_REGISTRATION_MODE": "auto",
    }


def run_example(plugins_dir: Path, widgets: int = 4) -> AbstractAsyncContextManager[HostProcess]:
    """``devicehost run --backend example``; ``auto`` registers on kubelet.sock here (no DEPRECATION)."""
    return host_process(plugins_dir, ["example"], env=example_env(widgets))


async def test_sigterm_makes_allocatable_drop_to_zero(kubelet: DpHarness, plugins_dir: Path) -> None:
    async with run_example(plugins_dir) as host:
        reached, count, _ = await kubelet.wait(WIDGET, 4, timeout=30)
        assert reached, f"allocatable {count}; host log {host.lines}"
        assert await host.stop(signal.SIGTERM) == 0
    report = await kubelet.until(lambda r: r.allocatable.get(WIDGET) == 0, "allocatable 0 after SIGTERM")
    assert report.capacity == {WIDGET: 4}, "capacity stays for the kubelet's grace period"
    assert socket_files(plugins_dir) == []
    refused = await kubelet.allocate("pod-1", WIDGET, 1)
    assert not refused.ok
    assert refused.stage == "allocate"
    assert refused.error == f"no healthy devices present; cannot allocate unhealthy devices {WIDGET}"


async def test_an_overlapping_rolling_update_keeps_the_resource(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    """kubelet 1.32: the old host's stream ending disconnects the resource although the new host
    registered it; the new host sees its own stream end and registers again."""
    async with run_example(plugins_dir, 4) as old:
        assert (await kubelet.wait(WIDGET, 4, timeout=30))[0]
        async with run_example(plugins_dir, 6) as new:
            assert (await kubelet.wait(WIDGET, 6, timeout=30))[0], (
                "the new host's registration replaced the old"
            )
            assert len(socket_files(plugins_dir)) == 2, "unique socket names while both run"
            assert await old.stop(signal.SIGTERM) == 0
            # the kubelet closed the new host's stream too (runClient disconnects the current client)
            await new.wait_for_log("registered", timeout=30, registrations=2, reason="stream lost")
            ended = {"ListAndWatch stream ended by the kubelet"}  # held a while, or just registered:
            ended.add("the kubelet keeps ending the stream soon after registering; backing off")
            assert any(line.get("event") in ended for line in new.lines), "the lost stream was not logged"
            report = await kubelet.until(
                lambda r: r.allocatable.get(WIDGET) == 6, "the new host's widgets after the old one stopped"
            )
            assert report.capacity == {WIDGET: 6}
            allocation = await kubelet.allocate("pod-1", WIDGET, 6)  # widget-4, widget-5: only the new host
            assert allocation.ok, allocation.error
            assert len(socket_files(plugins_dir)) == 1
    log = (plugins_dir.parent / f"{plugins_dir.name}-dpharness.log").read_text()
    assert "ListAndWatch ended unexpectedly" in log


async def test_the_kubelet_checkpoint_keeps_allocations_across_a_host_restart(
    kubelet: DpHarness, plugins_dir: Path
) -> None:
    async with run_example(plugins_dir) as first:
        assert (await kubelet.wait(WIDGET, 4, timeout=30))[0]
        held = await kubelet.allocate("held", WIDGET, 2)
        assert held.ok, held.error
        assert await first.stop(signal.SIGTERM) == 0
    await kubelet.until(lambda r: r.allocatable.get(WIDGET) == 0, "the host is gone")
    assert (plugins_dir / "kubelet_internal_checkpoint").exists()
    await kubelet.restart()  # the kubelet too: only its checkpoint remembers the held pod
    async with run_example(plugins_dir):
        assert (await kubelet.wait(WIDGET, 4, timeout=30))[0]
        after = await kubelet.allocate("after", WIDGET, 2)
        assert after.ok, after.error
        assert not set(after.device_ids) & set(held.device_ids), "the held pod kept its widgets"
        refused = await kubelet.allocate("one-more", WIDGET, 1)
        assert not refused.ok
        assert await kubelet.release("held")
        freed = await kubelet.allocate("freed", WIDGET, 2)
        assert freed.ok, freed.error
        assert sorted(freed.device_ids) == sorted(held.device_ids)
