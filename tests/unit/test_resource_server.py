"""One resource served and registered (``host/serving/resource.py``) with the host's own socket
watch, Register client and registration, to the kubelet stand-in, without a Host around it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hostfakes import ScriptedBackend, widgets
from waiting import eventually

from devicehost import Device, Health
from devicehost.host.backends.backend import Backend
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.kubelet.client import KubeletClient
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch
from devicehost.host.serving.mode import for_mode
from devicehost.host.serving.resource import ResourceServer, Serving, keep_newer_health
from devicehost.testing.kubelet import KubeletStandIn

WIDGET = "example.com/widget"


@pytest.fixture
async def serving(kubelet: KubeletStandIn, plugin_dir: Path) -> AsyncIterator[Serving]:
    """What a host start's resources share, over a running socket watch and Register client;
    its context polls health every 0.05 s and makes sockets 0660."""
    watch = KubeletSocketWatch(plugin_dir)
    client = KubeletClient(watch, lambda: 5.0)
    registration = for_mode("kubelet", plugin_dir, plugin_dir.parent / "registry", watch, client)
    watching = asyncio.create_task(watch.run())
    rediscoveries: list[None] = []
    context = HostContext(HostConfig(health_interval=0.05, socket_mode=0o660))
    yield Serving(context, registration, "t1", lambda: rediscoveries.append(None), lambda r: lambda s: None)
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)
    await client.close()


def test_discovery_repeating_what_it_said_keeps_the_newer_health() -> None:
    current = (Device("w0", Health.UNHEALTHY), Device("w1"))  # w0 turned sick since (notifier, health hook)
    said_last = {"w0": Health.HEALTHY, "w1": Health.HEALTHY}
    again = (Device("w0"), Device("w1", Health.UNHEALTHY), Device("w2"))
    assert keep_newer_health(current, said_last, again) == (
        Device("w0", Health.UNHEALTHY),  # discovery said nothing new about w0
        Device("w1", Health.UNHEALTHY),  # discovery's own news
        Device("w2"),
    )


async def test_a_resource_is_served_polled_superseded_and_withdrawn(
    kubelet: KubeletStandIn, serving: Serving
) -> None:
    plugin = ScriptedBackend(widgets(WIDGET, 2))
    backend = Backend("ex", plugin, hook_timeout=5.0)
    server = ResourceServer(backend, widgets(WIDGET, 2), serving)
    try:
        await server.start()
        await kubelet.wait_for_resource(WIDGET, healthy=2)
        await eventually(lambda: server.state().registered, "registered")
        assert server.socket.path.is_socket()
        assert server.socket.path.stat().st_mode & 0o777 == 0o660  # the context's socket_mode

        plugin.health = {"w1": Health.UNHEALTHY}  # the health hook's next answer
        await kubelet.wait_for_resource(WIDGET, healthy=1)
        assert server.state().devices == {"Healthy": 1, "Unhealthy": 1}

        server.supersede("devicehost-other.sock", present={"devicehost-other.sock"})
        assert (server.state().registered, server.state().superseded_by) == (False, "devicehost-other.sock")
        server.supersede("", present=set())  # the other host left: register again
        assert server.state().superseded_by == ""
        await eventually(lambda: kubelet.registrations(WIDGET) == 2, "registered again")
    finally:
        await server.stop()
        backend.close()
    assert not server.socket.path.exists()
    assert plugin.count("devicehost_stop", WIDGET) == 1
