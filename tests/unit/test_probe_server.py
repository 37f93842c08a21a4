"""ProbeServer: /metrics, /healthz, /readyz and /status over real HTTP, as the snapshot changes."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.ops.probes import ProbeServer
from devicehost.host.ops.status import print_status
from devicehost.host.state import STARTING, BackendState, HostState, KubeletState, ResourceState

WIDGET = "example.com/widget"
GADGET = "example.com/gadget"


def resource(name: str, *, registered: bool) -> ResourceState:
    return ResourceState(
        name=name,
        backend="alpha",
        socket=f"/var/lib/kubelet/device-plugins/{name.rpartition('/')[2]}.sock",
        registered=registered,
        streams=1 if registered else 0,
        devices={"Healthy": 2},
        registrations={"start": 1} if registered else {},
        updates_sent=1,
        allocations=0,
        errors={},
    )


BEFORE_DISCOVERY = HostState(
    kubelet=KubeletState("/var/lib/kubelet/device-plugins/kubelet.sock", True),
    backends=(BackendState("alpha", True), BackendState("beta", False, reason="import failed")),
    resources=(),
    discoveries=0,
)


class FakeHost:
    """A stand-in for the host: its snapshot is whatever the test last set."""

    def __init__(self) -> None:
        self.state = BEFORE_DISCOVERY
        self.snapshots = 0

    def snapshot(self) -> HostState:
        self.snapshots += 1
        return self.state

    def serve(self, *resources: ResourceState) -> None:
        self.state = dataclasses.replace(
            self.state, resources=resources, discoveries=self.state.discoveries + 1
        )

    def stick(self, backend: str, *hooks: str) -> None:
        backends = tuple(
            dataclasses.replace(b, stuck_hooks=hooks) if b.name == backend else b for b in self.state.backends
        )
        self.state = dataclasses.replace(self.state, backends=backends)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def address() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
async def server(host: FakeHost, address: str) -> AsyncIterator[ProbeServer]:
    metrics = HostMetrics()
    metrics.watch(host.snapshot)
    probes = ProbeServer(host.snapshot, metrics, address)
    await probes.start()
    try:
        yield probes
    finally:
        await probes.stop()


@pytest.fixture
async def client(server: ProbeServer) -> AsyncIterator[aiohttp.ClientSession]:
    base = f"http://{server.bind}:{server.port}"
    async with aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def get(client: aiohttp.ClientSession, path: str) -> tuple[int, str]:
    async with client.get(path) as reply:
        return reply.status, await reply.text()


def test_the_address_is_split_into_bind_and_port(host: FakeHost) -> None:
    probes = ProbeServer(host.snapshot, HostMetrics(), "0.0.0.0:9400")
    assert (probes.bind, probes.port) == ("0.0.0.0", 9400)
    probes = ProbeServer(host.snapshot, HostMetrics(), ":9400")
    assert (probes.bind, probes.port) == ("", 9400)
    assert host.snapshots == 0


async def test_readyz_follows_discovery_and_registration(
    host: FakeHost, client: aiohttp.ClientSession
) -> None:
    beta = "  backend beta: not loaded: import failed\n"
    assert await get(client, "/readyz") == (
        503,
        "not ready:\n  host: the first discovery is not done (its resources are not all served yet)\n" + beta,
    )
    host.state = dataclasses.replace(host.state, backends=host.state.backends[:1])

    host.serve(resource(WIDGET, registered=False), resource(GADGET, registered=False))
    assert await get(client, "/readyz") == (
        503,
        f"not ready:\n  resource {WIDGET} (backend alpha): not registered and streaming\n"
        f"  resource {GADGET} (backend alpha): not registered and streaming\n",
    )

    host.serve(resource(WIDGET, registered=True), resource(GADGET, registered=False))
    assert await get(client, "/readyz") == (
        503,
        f"not ready:\n  resource {GADGET} (backend alpha): not registered and streaming\n",
    )

    host.serve(resource(WIDGET, registered=True), resource(GADGET, registered=True))
    assert await get(client, "/readyz") == (200, "ok: 2 resources registered\n")

    host.serve()
    assert await get(client, "/readyz") == (200, "ok: 0 resources registered\n")


async def test_a_stuck_hook_fails_readyz_naming_the_backend_and_never_healthz(
    host: FakeHost, client: aiohttp.ClientSession
) -> None:
    host.state = dataclasses.replace(host.state, backends=host.state.backends[:1])
    host.serve(resource(WIDGET, registered=True))
    assert await get(client, "/healthz") == (200, "ok\n")

    host.stick("alpha", "devicehost_discover", "devicehost_health")
    assert await get(client, "/healthz") == (200, "ok\n")
    assert await get(client, "/readyz") == (
        503,
        "not ready:\n  backend alpha: devicehost_discover, devicehost_health stuck past the hook timeout\n",
    )

    host.stick("alpha")
    assert (await get(client, "/readyz"))[0] == 200


async def test_healthz_fails_only_when_the_host_loop_ended(
    host: FakeHost, client: aiohttp.ClientSession
) -> None:
    host.state = STARTING
    assert await get(client, "/healthz") == (200, "ok\n")
    assert await get(client, "/readyz") == (503, "not ready:\n  host: starting\n")
    host.state = dataclasses.replace(BEFORE_DISCOVERY, loop="ended")
    assert await get(client, "/healthz") == (503, "host: ended\n")


async def test_status_serves_the_document_of_the_current_snapshot(
    host: FakeHost, client: aiohttp.ClientSession
) -> None:
    async with client.get("/status") as reply:
        assert reply.status == 200
        assert reply.content_type == "application/json"
        doc = await reply.json()
    assert (doc["ready"], doc["live"], doc["resources"]) == (False, True, {})
    assert doc["backends"] == {
        "alpha": {"status": "loaded", "stuck_hooks": []},
        "beta": {"status": "failed", "reason": "import failed"},
    }

    host.serve(resource(WIDGET, registered=True))
    host.stick("alpha", "devicehost_health")
    async with client.get("/status") as reply:
        doc = await reply.json()
    assert (doc["ready"], doc["live"]) == (False, True)
    assert "backend alpha: devicehost_health stuck past the hook timeout" in doc["problems"]
    assert doc["backends"]["alpha"] == {"status": "loaded", "stuck_hooks": ["devicehost_health"]}
    assert doc["resources"][WIDGET]["registered"] is True
    assert doc["resources"][WIDGET]["devices"] == 2


async def test_metrics_are_scraped_from_the_current_snapshot(
    host: FakeHost, client: aiohttp.ClientSession
) -> None:
    async with client.get("/metrics") as reply:
        assert reply.status == 200
        assert reply.content_type == "text/plain"
        text = (await reply.text()).splitlines()
    assert 'devicehost_backend_loaded{backend="beta"} 0.0' in text
    assert not [line for line in text if line.startswith("devicehost_resource_registered{")]

    host.serve(resource(WIDGET, registered=True))
    status, body = await get(client, "/metrics")
    assert status == 200
    assert f'devicehost_resource_registered{{backend="alpha",resource="{WIDGET}"}} 1.0' in body.splitlines()


async def test_each_answer_takes_one_snapshot(host: FakeHost, client: aiohttp.ClientSession) -> None:
    for path in ("/healthz", "/readyz", "/status", "/metrics"):
        before = host.snapshots
        await get(client, path)
        assert host.snapshots == before + 1, path


async def test_print_status_reads_the_served_document(
    host: FakeHost, server: ProbeServer, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host.serve(resource(WIDGET, registered=True))
    assert await asyncio.to_thread(print_status, address) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "kubelet: /var/lib/kubelet/device-plugins/kubelet.sock (present)"
    assert out[1] == "ready: no   live: yes"
    assert out[2] == "  not ready: backend beta: not loaded: import failed"
    assert any(line.split() == ["beta", "failed", "import", "failed"] for line in out)
    assert any(line.split()[:3] == [WIDGET, "alpha", "registered"] for line in out)


async def test_stop_closes_the_port(host: FakeHost, address: str) -> None:
    probes = ProbeServer(host.snapshot, HostMetrics(), address)
    await probes.start()
    await probes.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://{address}/healthz")
