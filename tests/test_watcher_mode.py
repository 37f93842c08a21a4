"""Registration through the kubelet's plugin watcher (plugins_registry), against the stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostfakes import ScriptedBackend, running_host, socket_files, widgets
from waiting import eventually

from devicehost.testing.kubelet import EventKind, KubeletStandIn

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def registry_dir(short_tmp: Path) -> Path:
    directory = short_tmp / "reg"
    directory.mkdir()
    return directory


@pytest.mark.parametrize("mode", ["watcher", "auto"])
async def test_resources_register_through_the_plugin_watcher(
    plugin_dir: Path, registry_dir: Path, mode: str
) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2), widgets("example.com/b", 3))
    # auto picks the watcher only from a DEPRECATION file, which kubelet 1.32 does not write
    async with KubeletStandIn(
        plugin_dir, registry_dir, watcher=True, deprecation_file=mode == "auto"
    ) as kubelet:
        settings = {"registration_mode": mode, "plugins_registry_dir": registry_dir}
        async with running_host(plugin_dir, {"w": backend}, **settings) as host:
            await kubelet.wait_for_resource("example.com/a", healthy=2)
            await kubelet.wait_for_resource("example.com/b", healthy=3)
            assert socket_files(registry_dir) == sorted(s.socket.name for s in host.resources.values())
            assert socket_files(plugin_dir) == []
            # the kubelet's NotifyRegistrationStatus reaches the host after the stream started
            await eventually(
                lambda: all(r.registered for r in host.snapshot().resources), "the host saw both registered"
            )
            result = await kubelet.allocate("example.com/b", 2)
            assert dict(result.response.container_responses[0].envs) == {"IDS": "w0,w1"}
        await kubelet.wait_for_event(EventKind.DEREGISTERED, "example.com/a", since=0)
        assert socket_files(registry_dir) == []


async def test_watcher_mode_registers_again_after_a_dropped_stream(
    plugin_dir: Path, registry_dir: Path
) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 2))
    async with (
        KubeletStandIn(plugin_dir, registry_dir, watcher=True) as kubelet,
        running_host(
            plugin_dir, {"w": backend}, registration_mode="watcher", plugins_registry_dir=registry_dir
        ) as host,
    ):
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        since = len(kubelet.events)
        kubelet.drop_stream("example.com/a")
        await kubelet.wait_for_event(EventKind.REGISTERED, "example.com/a", since=since)
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        # The host counts a registration when the kubelet's NotifyRegistrationStatus arrives,
        # which the plugin watcher sends after Register returned and the stream started: the
        # stand-in's REGISTERED event and the new stream come first, so wait for the host's count.
        await eventually(
            lambda: host.snapshot().resource("example.com/a").registration_count >= 2,
            "the host counted the second registration",
        )
        assert host.snapshot().resource("example.com/a").registration_count == 2


async def test_auto_mode_uses_kubelet_sock_without_the_deprecation_file(
    kubelet: KubeletStandIn, plugin_dir: Path, registry_dir: Path
) -> None:
    backend = ScriptedBackend(widgets("example.com/a", 1))
    async with running_host(plugin_dir, {"k": backend}, plugins_registry_dir=registry_dir) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=1)
        assert host.resources["example.com/a"].socket.directory == plugin_dir
        assert socket_files(registry_dir) == []
