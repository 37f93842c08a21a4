"""One truth about the host's state: ``/readyz``, ``/status``, ``devicehost status`` and the
metrics agree, and none says "fine" while something the node relies on is not so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostfakes import ScriptedBackend, captured_logs, running_host, widgets
from probing import free_port, get, sample
from waiting import eventually

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.app import running
from devicehost.host.backends.backend import Backend
from devicehost.host.backends.loader import load_backends
from devicehost.host.config import HostConfig, build_config
from devicehost.host.daemon import Host
from devicehost.testing.host import host_process
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)


class FlakyDiscovery:
    """Discovers one FPGA, or raises while ``error`` is set."""

    def __init__(self) -> None:
        self.error: Exception | None = OSError("no such device: /dev/fpga0")

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        if self.error is not None:
            raise self.error
        return [Resource("fpga.example.com/fpga", (Device("f0"),))]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation()


async def status_command(port: int) -> str:
    """What ``devicehost status`` prints (run in a thread: the host answers on this loop)."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "devicehost", "status", "--address", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout


async def test_a_backend_whose_discovery_fails_is_not_ready_and_named(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    port = free_port()
    flaky = FlakyDiscovery()
    backends = {"fpga": flaky, "ex": ScriptedBackend(widgets("example.com/widget", 2))}
    async with running_host(
        plugin_dir, backends, metrics_address=f"127.0.0.1:{port}", rediscover_interval=0.1
    ) as host:
        await kubelet.wait_for_resource("example.com/widget", healthy=2)
        await eventually(lambda: host.discoveries > 0, "a discovery")
        problem = "backend fpga: discovery failed: backend 'fpga' devicehost_discover raised OSError: no such device: /dev/fpga0"
        code, text = await get(port, "/readyz")
        assert (code, text) == (503, f"not ready:\n  {problem}\n")
        _, doc = await get(port, "/status")
        status = json.loads(doc)
        assert status["ready"] is False
        assert status["problems"] == [problem]
        assert status["backends"]["fpga"]["discovery_error"] in problem
        _, metrics = await get(port, "/metrics")
        assert sample(metrics, "devicehost_backend_discovery_failing", backend="fpga") == 1
        assert sample(metrics, "devicehost_backend_discovery_failing", backend="ex") == 0
        assert "devicehost_ready 0.0" in metrics.splitlines()
        printed = await status_command(port)
        assert "ready: no" in printed
        assert f"  not ready: {problem}" in printed.splitlines()

        flaky.error = None  # the device came back: served, registered, ready again
        await kubelet.wait_for_resource("fpga.example.com/fpga", healthy=1)
        await eventually(lambda: host.snapshot().ready, "ready again")
        assert (await get(port, "/readyz"))[0] == 200


@contextlib.asynccontextmanager
async def host_reloading_from(config_file: Path) -> AsyncIterator[Host]:
    def load() -> HostConfig:
        return build_config(config_file, {}, {})

    config = load()
    statuses = load_backends(config.enabled_backends, config.disabled_backends, config.hook_timeout)
    backends = [s.backend for s in statuses if s.backend is not None]
    async with running(config, backends, reload_config=load) as host:  # reloads on request only
        yield host


async def test_a_refused_reload_shows_in_status_and_metrics(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path
) -> None:
    port = free_port()
    config_file = short_tmp / "config.yaml"

    def publish(resources: dict[str, int], **extra: object) -> None:
        config = {
            "device_plugins_dir": str(plugin_dir),
            "pod_resources_socket": str(short_tmp / "no-pod-resources.sock"),
            "metrics_address": f"127.0.0.1:{port}",
            "enabled_backends": ["example"],
            "backends": {"example": {"resources": resources}},
            **extra,
        }
        config_file.write_text(yaml.safe_dump(config))

    async def reload_and_read(host: Host) -> tuple[dict[str, object], str]:
        reloads = host.reloads.applied + host.reloads.refused
        host.request_reload()
        await eventually(lambda: host.reloads.applied + host.reloads.refused > reloads, "the reload")
        return json.loads((await get(port, "/status"))[1])["reloads"], (await get(port, "/metrics"))[1]

    publish({"example.com/a": 2})
    async with host_reloading_from(config_file) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)

        config_file.write_text("backends: [\n")  # not YAML: the whole file is refused
        reloads, metrics = await reload_and_read(host)
        assert reloads["latest_refused"] is True
        assert reloads["last_refused"]["what"] == "configuration"
        assert "is not valid YAML" in reloads["last_refused"]["why"]
        assert reloads["last_refused"]["at"].endswith("+00:00")
        assert sample(metrics, "devicehost_reloads_total", outcome="refused") == 1
        assert "devicehost_reload_refused 1.0" in metrics.splitlines()
        assert "reload refused (the latest reload): configuration at " in await status_command(port)

        with captured_logs() as lines:  # only the backend's new settings are refused
            publish({"example.com/a": -1}, health_interval=2.0)
            reloads, metrics = await reload_and_read(host)
        assert reloads["last_refused"]["what"] == "backends.example"
        assert "backends.example.resources.example.com/a" in reloads["last_refused"]["why"]
        (reloaded,) = [line for line in lines if line["event"] == "configuration reloaded"]
        assert reloaded["changed"] == ["health_interval"]  # not backends: the example kept its own
        assert reloaded["refused"] == ["backends.example"]
        assert host.config.backends["example"] == {"resources": {"example.com/a": 2}}
        assert sample(metrics, "devicehost_reloads_total", outcome="refused") == 2

        publish({"example.com/a": 3})
        reloads, metrics = await reload_and_read(host)
        assert (reloads["applied"], reloads["refused"], reloads["latest_refused"]) == (1, 2, False)
        assert reloads["last_refused"]["what"] == "backends.example"  # still said, as history
        assert "devicehost_reload_refused 0.0" in metrics.splitlines()
        await kubelet.wait_for_resource("example.com/a", healthy=3)


def test_the_readme_names_every_metric() -> None:
    from devicehost.host.ops.metrics import HostMetrics
    from devicehost.host.state import STARTING

    metrics = HostMetrics()
    metrics.watch(lambda: STARTING)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    named = set(re.findall(r"`(devicehost_\w+)`", readme))
    families = {family.name: family.type for family in metrics.registry.collect()}
    missing = [
        name
        for name, kind in families.items()
        if (f"{name}_total" if kind == "counter" else name) not in named
    ]
    assert missing == []


async def status_of(port: int) -> dict[str, Any]:
    return json.loads((await get(port, "/status"))[1])  # type: ignore[no-any-return]


async def test_two_hosts_on_one_dir_notice_each_other_and_only_the_latest_registration_counts(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    """The kubelet keeps the newer host's registration (kubelet 1.32 leaves the older stream
    open): the older host says so instead of 'registered'; when the newer host stops, the
    kubelet disconnects the resource and the older one registers it again."""
    widget = "example.com/widget"
    older_port, newer_port = free_port(), free_port()
    args = ["--rediscover-interval", "60"]  # every look here comes from the dir's changes
    async with host_process(
        plugin_dir, ["example"], args=[*args, "--metrics-address", f"127.0.0.1:{older_port}"]
    ) as older:
        await kubelet.wait_for_resource(widget, healthy=4)
        await older.wait_for_log("registered", resource=widget)
        assert (await status_of(older_port))["resources"][widget]["registered"] is True
        async with host_process(
            plugin_dir, ["example"], args=[*args, "--metrics-address", f"127.0.0.1:{newer_port}"]
        ) as newer:
            await newer.wait_for_log("registered", resource=widget)
            seen_by_newer = await newer.wait_for_log(
                "another host serves in this device-plugins dir; the "
                "kubelet keeps the latest registration of each resource"
            )
            seen_by_older = await older.wait_for_log(
                "another host serves in this device-plugins dir; the "
                "kubelet keeps the latest registration of each resource"
            )
            assert seen_by_newer["other_host"] == seen_by_older["this_host"]
            assert seen_by_older["other_host"] == seen_by_newer["this_host"]
            await older.wait_for_log(
                "superseded: another host registered this resource after us", resource=widget
            )
            old_view, new_view = await status_of(older_port), await status_of(newer_port)
            assert new_view["resources"][widget]["registered"] is True
            assert new_view["ready"] is True
            assert old_view["resources"][widget]["registered"] is False
            assert (
                old_view["resources"][widget]["superseded_by"]
                == Path(new_view["resources"][widget]["socket"]).name
            )
            assert old_view["ready"] is False
            assert any("superseded: another host's socket" in p for p in old_view["problems"])
            assert (
                sample(
                    (await get(older_port, "/metrics"))[1], "devicehost_resource_registered", resource=widget
                )
                == 0
            )
            since = len(kubelet.events)
            assert await newer.stop() == 0
        await kubelet.wait_for_event("disconnected", widget, since=since)
        await older.wait_for_log("the other host left this device-plugins dir")
        await older.wait_for_log(
            "the host that superseded this resource left; registering again", resource=widget
        )
        await kubelet.wait_for_resource(widget, healthy=4)
        view = await status_of(older_port)
        assert view["resources"][widget]["registered"] is True
        assert "superseded_by" not in view["resources"][widget]
        assert view["ready"] is True


async def test_a_refused_resource_is_named_once_and_the_valid_one_served(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    """``resources: {bad name: 2, example.com/widget: 2}``: the widget is served; the bad name is
    refused with the rule, logged once (not every round), and /readyz says so."""
    from devicehost_example import ExampleBackend

    port = free_port()
    settings = {"example": {"resources": {"bad name": 2, "example.com/widget": 2}}}
    config = HostConfig(
        device_plugins_dir=plugin_dir,
        pod_resources_socket=plugin_dir / "no-pod-resources.sock",
        backends=settings,
        metrics_address=f"127.0.0.1:{port}",
        rediscover_interval=0.05,
    )
    with captured_logs() as lines:
        async with running(config, [Backend("example", ExampleBackend(), 2.0)]) as host:
            await kubelet.wait_for_resource("example.com/widget", healthy=2)
            await eventually(lambda: host.discoveries >= 5, "five discovery rounds")
            code, text = await get(port, "/readyz")
            metrics = (await get(port, "/metrics"))[1]
    assert code == 503
    assert "backend example: resource 'bad name' refused: resource name 'bad name' must contain" in text
    assert sample(metrics, "devicehost_resources_refused", backend="example") == 1
    refused = [line for line in lines if line["event"] == "resource refused"]
    assert [line["resource"] for line in refused] == ["bad name"]


async def test_a_dead_hosts_socket_is_no_other_host(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    """A socket file of another token that nobody accepts on (a killed host's) supersedes nothing."""
    widget = "example.com/widget"
    with captured_logs() as lines:
        async with running_host(plugin_dir, {"ex": ScriptedBackend(widgets(widget, 2))}) as host:
            await kubelet.wait_for_resource(widget, healthy=2)
            with socket.socket(socket.AF_UNIX) as dead:
                dead.bind(
                    str(plugin_dir / "devicehost-example.com_widget-abcdef.sock")
                )  # bound, never listening
                host.peers.look()
                await asyncio.sleep(1)  # the second look at a socket that did not accept
                host.peers.look()
                assert host.snapshot().resource(widget).registered
                assert host.peers.hosts == {}
    assert not [line for line in lines if line["event"].startswith("another host serves")]
