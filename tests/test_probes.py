"""Metrics, probes and ``devicehost status`` against a running host, across a kubelet restart."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cdi_guard import child_environ
from hostfakes import ScriptedBackend, install_fake_distribution, running_host, widgets
from probing import free_port, get, sample
from waiting import eventually

from devicehost import Health
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)


async def test_metrics_and_probes_before_and_after_a_kubelet_restart(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    port = free_port()
    backend = ScriptedBackend(widgets("example.com/widget", 4))
    async with running_host(plugin_dir, {"ex": backend}, metrics_address=f"127.0.0.1:{port}"):
        await kubelet.wait_for_resource("example.com/widget", healthy=4)
        assert await get(port, "/healthz") == (200, "ok\n")
        assert (await get(port, "/readyz"))[0] == 200
        backend.notifiers["example.com/widget"].set_health({"w3": Health.UNHEALTHY})
        await kubelet.wait_for_resource("example.com/widget", healthy=3)
        await kubelet.allocate("example.com/widget", 1)
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.allocate_ids("example.com/widget", ["nope"])
        _, metrics = await get(port, "/metrics")
        labels = {"resource": "example.com/widget", "backend": "ex"}
        assert sample(metrics, "devicehost_devices", **labels, health="Healthy") == 3
        assert sample(metrics, "devicehost_devices", **labels, health="Unhealthy") == 1
        assert sample(metrics, "devicehost_resource_registered", **labels) == 1
        assert sample(metrics, "devicehost_listandwatch_streams", **labels) == 1
        assert sample(metrics, "devicehost_listandwatch_updates_total", **labels) == 2
        assert sample(metrics, "devicehost_registrations_total", **labels, reason="start") == 1
        assert sample(metrics, "devicehost_allocations_total", **labels) == 1
        assert sample(metrics, "devicehost_errors_total", **labels, code="INVALID_ARGUMENT") == 1
        assert (
            sample(metrics, "devicehost_allocation_duration_seconds_count", resource="example.com/widget")
            == 2
        )
        assert sample(metrics, "devicehost_backend_loaded", backend="ex") == 1

        await kubelet.crash(0.0)
        await kubelet.wait_for_resource("example.com/widget", healthy=3)
        assert (await get(port, "/readyz"))[0] == 200
        _, metrics = await get(port, "/metrics")
        assert sample(metrics, "devicehost_resource_registered", **labels) == 1
        restarts = sum(
            sample(metrics, "devicehost_registrations_total", **labels, reason=reason)
            for reason in ("kubelet restarted", "stream lost", "socket removed", "kubelet appeared")
        )
        assert restarts == 1
        assert sample(metrics, "devicehost_devices", **labels, health="Healthy") == 3


async def test_readyz_fails_while_the_kubelet_is_gone(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    port = free_port()
    backend = ScriptedBackend(widgets("example.com/widget", 1))
    async with running_host(plugin_dir, {"ex": backend}, metrics_address=f"127.0.0.1:{port}"):
        await kubelet.wait_for_resource("example.com/widget", healthy=1)
        await kubelet.stop()
        status, text = await get(port, "/readyz")
        assert status == 503
        assert "example.com/widget" in text


async def test_a_stuck_hook_fails_readyz_naming_the_backend_and_never_healthz(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    port = free_port()
    backend = ScriptedBackend(widgets("example.com/widget", 1))
    backend.hanging.add("devicehost_allocate")
    other = ScriptedBackend(widgets("other.example.com/gadget", 1))
    async with running_host(
        plugin_dir, {"stuck": backend, "other": other}, metrics_address=f"127.0.0.1:{port}", hook_timeout=0.2
    ):
        await kubelet.wait_for_resource("example.com/widget", healthy=1)
        await kubelet.wait_for_resource("other.example.com/gadget", healthy=1)
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.allocate_ids("example.com/widget", ["w0"])
        assert await get(port, "/healthz") == (200, "ok\n")
        assert await get(port, "/readyz") == (
            503,
            "not ready:\n  backend stuck: devicehost_allocate stuck past the hook timeout\n",
        )
        await kubelet.allocate("other.example.com/gadget", 1)  # the other backend is untouched
        _, metrics = await get(port, "/metrics")
        assert (
            sample(metrics, "devicehost_hook_failures_total", backend="stuck", hook="devicehost_allocate")
            == 1
        )
        assert sample(metrics, "devicehost_hooks_stuck", backend="stuck") == 1
        assert "devicehost_ready 0.0" in metrics.splitlines()
        assert "devicehost_live 1.0" in metrics.splitlines()
        _, body = await get(port, "/status")
        assert json.loads(body)["problems"] == [
            "backend stuck: devicehost_allocate stuck past the hook timeout"
        ]
        backend.hang.set()
        for _ in range(100):
            if (await get(port, "/readyz"))[0] == 200:
                break
            await asyncio.sleep(0.02)
        assert (await get(port, "/readyz"))[0] == 200


async def test_readyz_is_503_until_the_first_discoverys_resources_are_served(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    """Between the first discovery and its resources being served there is nothing registered
    yet: that is not ready (it once answered ``200 ok: 0 resources registered``)."""
    port = free_port()
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    backend.hanging = {"devicehost_start"}  # the resource's start hook takes its time
    async with running_host(plugin_dir, {"ex": backend}, metrics_address=f"127.0.0.1:{port}"):
        await eventually(lambda: backend.count("devicehost_start") == 1, "the start hook called")
        assert await get(port, "/readyz") == (
            503,
            "not ready:\n  host: the first discovery is not done (its resources are not all served yet)\n",
        )
        backend.hang.set()
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        await eventually_ready(port)
        assert await get(port, "/readyz") == (200, "ok: 1 resources registered\n")


async def eventually_ready(port: int, within: float = 10.0) -> None:
    """Poll ``/readyz`` every 10 ms until it answers 200; fail with its last answer."""
    answer = await get(port, "/readyz")
    async with asyncio.timeout(within):
        while answer[0] != 200:
            await asyncio.sleep(0.01)
            answer = await get(port, "/readyz")


async def test_a_backend_that_refused_its_settings_shows_in_readyz_not_healthz(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    port = free_port()
    good = ScriptedBackend(widgets("example.com/widget", 1))
    async with running_host(
        plugin_dir,
        {"ex": good},
        metrics_address=f"127.0.0.1:{port}",
        failed_backends={"acme": "settings refused: x"},
    ):
        await kubelet.wait_for_resource("example.com/widget", healthy=1)
        assert await get(port, "/healthz") == (200, "ok\n")
        assert await get(port, "/readyz") == (
            503,
            "not ready:\n  backend acme: not loaded: settings refused: x\n",
        )


async def test_status_endpoint_and_command(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    port = free_port()
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    async with running_host(plugin_dir, {"ex": backend}, metrics_address=f"127.0.0.1:{port}"):
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        _, body = await get(port, "/status")
        state = json.loads(body)
        assert state["ready"] is True
        assert state["resources"]["example.com/widget"]["healthy"] == 2
        assert state["backends"]["ex"] == {"status": "loaded", "stuck_hooks": []}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "devicehost",
            "status",
            "--address",
            f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        text = out.decode()
        assert "ready: yes   live: yes" in text
        assert re.search(r"example\.com/widget\s+ex\s+registered\s+2/2 healthy", text)


SLOW_IMPORT_BACKEND = """
import pathlib, time
import devicehost

pathlib.Path(__file__).with_name("importing").touch()
time.sleep(3)

@devicehost.hookimpl
def devicehost_discover():
    return [devicehost.Resource("slow.example.com/thing", (devicehost.Device("t0"),))]

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()
"""


async def test_the_probe_port_listens_before_the_backends_load(
    kubelet: KubeletStandIn, plugin_dir: Path, tmp_path: Path
) -> None:
    """A probe at pod start waits in the backlog and is answered, instead of 'connection refused'."""
    site = tmp_path / "site"
    install_fake_distribution(
        site, "devicehost-slowimport", "dh_slowimport", SLOW_IMPORT_BACKEND, "slow = dh_slowimport"
    )
    env = child_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    port = free_port()
    args = ["run", "--device-plugins-dir", str(plugin_dir), "--backend", "slow"]
    env["DEVICEHOST_METRICS_ADDRESS"] = f"127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devicehost",
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: (site / "importing").exists(), "the backend's import started", within=20)
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass  # listening while the backend still imports: not refused
        assert await get(port, "/healthz") == (200, "ok\n")  # answered once the server runs
        await kubelet.wait_for_resource("slow.example.com/thing", healthy=1, timeout=20)
        assert (await get(port, "/readyz"))[0] == 200
    finally:
        proc.terminate()
        await proc.wait()


def test_a_taken_metrics_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = child_environ()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env["DEVICEHOST_METRICS_ADDRESS"] = f"127.0.0.1:{port}"
        result = subprocess.run(
            [sys.executable, "-m", "devicehost", "run", "--simulate-kubelet", "--backend", "example"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"devicehost: cannot listen on metrics address 127.0.0.1:{port}: Address already in use"
    ]


def test_the_readyz_start_poll_tool_sees_no_early_yes() -> None:
    """``tools/readyz_at_start.py`` (README) polls a real host's first second every 2 ms; with no
    kubelet nothing can be registered, so no answer may be 200."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "readyz_at_start.py"
    result = subprocess.run(
        [sys.executable, str(tool), "--starts", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environ(),
    )
    assert result.returncode == 0, result.stderr
    first, last = result.stdout.splitlines()
    assert re.fullmatch(r"start 1: \d+ answers, 0 early 200: .*", first), first
    assert "503 host: the first discovery is not done" in first or "not registered and streaming" in first
    assert last == "0 of 1 starts answered 200 before anything could be registered"
