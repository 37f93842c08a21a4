"""Soak: steady Allocates, periodic kubelet restarts and health flaps; memory and fds stay flat."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from faultkit import Ledger, open_fds, rss_kib
from hostfakes import ScriptedBackend, running_host, socket_files, widgets

from devicehost import Health
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(900)

NAME = "example.com/soak"


async def test_soak(kubelet: KubeletStandIn, plugin_dir: Path, long_mode: bool, ledger: Ledger) -> None:
    """Every Allocate made while registered succeeds; RSS and fds end where they started."""
    duration = 180.0 if long_mode else 30.0
    backend = ScriptedBackend(widgets(NAME, 4), widgets("example.com/flappy", 2))
    calls = failed = restarts = flaps = 0
    turn = asyncio.Lock()  # a restart and an Allocate do not overlap: each call should succeed
    async with running_host(plugin_dir, {"b": backend}):
        await kubelet.wait_for_resource(NAME, healthy=4)
        await kubelet.wait_for_resource("example.com/flappy", healthy=2)
        for _ in range(200):  # warm up allocator pools and grpc before the first measurement
            await kubelet.allocate_ids(NAME, ["w1"])
        rss_start, fds_start = rss_kib(), open_fds()
        deadline = time.monotonic() + duration

        async def allocates() -> None:
            nonlocal calls, failed
            while time.monotonic() < deadline:
                async with turn:
                    await kubelet.wait_for_resource(NAME, healthy=4)
                    try:
                        response = await kubelet.allocate_ids(NAME, ["w1", "w2"])
                        assert dict(response.container_responses[0].envs) == {"IDS": "w1,w2"}
                    except Exception:
                        failed += 1
                        raise
                    calls += 1
                await asyncio.sleep(0.002)

        async def restarts_and_flaps() -> None:
            nonlocal restarts, flaps
            notifier = backend.notifiers["example.com/flappy"]
            while time.monotonic() < deadline:
                for n in range(50):
                    notifier.set_health({"w0": Health.UNHEALTHY if n % 2 == 0 else Health.HEALTHY})
                    await asyncio.sleep(0.01)
                flaps += 50
                async with turn:
                    await kubelet.restart()
                    restarts += 1
                    await kubelet.wait_for_resource(NAME, healthy=4)

        await asyncio.gather(allocates(), restarts_and_flaps())
        await kubelet.wait_for_resource("example.com/flappy", healthy=2)
        assert len(socket_files(plugin_dir)) == 2
        rss_end, fds_end = rss_kib(), open_fds()
    assert failed == 0
    assert calls > duration * 20
    assert fds_end <= fds_start + 8, (fds_start, fds_end)
    assert rss_end <= rss_start + 40 * 1024, (rss_start, rss_end)
    ledger.add("soak seconds", int(duration))
    ledger.add("soak Allocate calls", calls)
    ledger.add("soak calls failed that should have succeeded", failed)
    ledger.add("soak kubelet restarts", restarts)
    ledger.add("kubelet restarts survived", restarts)
    ledger.add("soak health flips", flaps)
    ledger.note("soak RSS (KiB)", rss_start, rss_end)
    ledger.note("soak open fds", fds_start, fds_end)
