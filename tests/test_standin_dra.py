"""The kubelet stand-in's DRA side: drivers register through ``plugins_registry`` as with kubelet
1.34+, and ``kubelet.dra`` prepares and unprepares claims over real gRPC, with the kubelet's checks.

Against a small DRAPlugin servicer written here, then against the real host (ClusterStandIn as
its API server)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc
from devicehost.proto.pluginregistration.v1 import api_pb2 as reg_pb2
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as reg_pb2_grpc
from devicehost.standin import DraCallError, DraDevice, EventKind, KubeletStandIn
from devicehost.standin.dra import CALL_TIMEOUT
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host
from devicehost_example import ExampleBackend

DRIVER = "gpu.example.com"
CLAIM = ("default", "uid-1", "claim-1")
Context = grpc.aio.ServicerContext[Any, Any]


class Driver(api_pb2_grpc.DRAPluginServicer):
    """A bare DRA driver: each claim gets one device, unless told to fail, forget or stall."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.fail: dict[str, str] = {}
        self.forget: set[str] = set()
        self.stranger = ""
        self.delay = 0.0

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: Context
    ) -> api_pb2.NodePrepareResourcesResponse:
        self.requests.append(request)
        await asyncio.sleep(self.delay)
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.uid in self.forget:
                continue
            if claim.uid in self.fail:
                response.claims[claim.uid].error = self.fail[claim.uid]
                continue
            response.claims[claim.uid].devices.append(
                api_pb2.Device(
                    request_names=["gpu"],
                    pool_name="node-a/gpu",
                    device_name=f"gpu-{claim.name}",
                    cdi_device_ids=[f"{DRIVER}/gpu={claim.name}"],
                )
            )
        if self.stranger:
            response.claims[self.stranger].error = ""
        return response

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: Context
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        self.requests.append(request)
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            if claim.uid not in self.forget:
                response.claims[claim.uid].error = self.fail.get(claim.uid, "")
        return response


class Info(reg_pb2_grpc.RegistrationServicer):
    """A registration socket's answers; the kubelet's verdicts are kept."""

    def __init__(self, info: reg_pb2.PluginInfo) -> None:
        self.info = info
        self.get_info_calls = 0
        self.statuses: asyncio.Queue[reg_pb2.RegistrationStatus] = asyncio.Queue()

    async def GetInfo(self, request: reg_pb2.InfoRequest, context: Context) -> reg_pb2.PluginInfo:
        self.get_info_calls += 1
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: Context
    ) -> reg_pb2.RegistrationStatusResponse:
        self.statuses.put_nowait(request)
        return reg_pb2.RegistrationStatusResponse()

    async def status(self) -> reg_pb2.RegistrationStatus:
        return await asyncio.wait_for(self.statuses.get(), 5)


def dra_info(
    endpoint: Path | str,
    name: str = DRIVER,
    versions: Sequence[str] = ("v1.DRAPlugin",),
    kind: str = "DRAPlugin",
) -> reg_pb2.PluginInfo:
    return reg_pb2.PluginInfo(type=kind, name=name, endpoint=str(endpoint), supported_versions=list(versions))


class Servers:
    """gRPC servers started by a test, all stopped at its end."""

    def __init__(self) -> None:
        self.running: list[grpc.aio.Server] = []

    async def serve(self, path: Path, *servicers: Any) -> grpc.aio.Server:
        server = grpc.aio.server()
        for servicer in servicers:
            if isinstance(servicer, Info):
                reg_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
            else:
                api_pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self.running.append(server)
        return server


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="sdra"))
    (path / "plugins").mkdir()
    yield path
    shutil.rmtree(path)


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    pool = Servers()
    yield pool
    await asyncio.gather(*(server.stop(None) for server in pool.running))


@pytest.fixture
async def kubelet(base: Path, servers: Servers) -> AsyncIterator[KubeletStandIn]:
    """Kubelet mode (no ``watcher=True``): DRA drivers still register through plugins_registry."""
    async with KubeletStandIn(base / "dp", base / "reg", dial_timeout=0.3) as standin:
        yield standin


async def serve_driver(
    base: Path, servers: Servers, driver: Driver | None = None, socket: str = "dra.sock", **info: Any
) -> Info:
    """Serve a DRAPlugin endpoint and its registration socket; the registration's servicer."""
    endpoint = base / "plugins" / socket
    await servers.serve(endpoint, driver or Driver())
    registration = Info(dra_info(endpoint, **info))
    await servers.serve(base / "reg" / f"reg-{socket}", registration)
    return registration


# -- registration -------------------------------------------------------------------------------


async def test_a_dra_driver_registers_and_deregisters_with_its_socket(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    registration = await serve_driver(base, servers)
    status = await registration.status()
    assert (status.plugin_registered, status.error) == (True, "")
    assert kubelet.dra.drivers == [DRIVER]
    assert kubelet.dra.endpoints(DRIVER) == [str(base / "plugins" / "dra.sock")]
    assert await kubelet.dra.wait_for_driver(DRIVER) == str(base / "plugins" / "dra.sock")
    event = await kubelet.wait_for_event(EventKind.REGISTERED, DRIVER, since=0)
    assert "DRA driver endpoint" in event.detail
    assert kubelet.resources == []  # a driver is no device plugin resource

    os.unlink(base / "reg" / "reg-dra.sock")
    event = await kubelet.wait_for_event(EventKind.DEREGISTERED, DRIVER, since=0)
    assert "plugin socket removed" in event.detail
    assert kubelet.dra.drivers == []
    with pytest.raises(DraCallError, match=f"^DRA driver {DRIVER} is not registered$"):
        await kubelet.dra.prepare(DRIVER, [CLAIM])


@pytest.mark.parametrize(("version", "service"), [("1.36", "v1alpha1"), ("1.37", "v1")])
async def test_a_kubelet_with_health_retries_a_driver_without_it_every_few_seconds(
    base: Path, servers: Servers, version: str, service: str
) -> None:
    async with KubeletStandIn(base / "dp", base / "reg", kubernetes_version=version) as kubelet:
        kubelet.dra.health.retry = 0.2
        await serve_driver(base, servers)  # serves DRAPlugin only
        await kubelet.dra.wait_for_driver(DRIVER)
        first = await kubelet.wait_for_event(EventKind.HEALTH_FAILED, DRIVER, since=0)
        again = await kubelet.wait_for_event(EventKind.HEALTH_FAILED, DRIVER, since=len(kubelet.events))
    assert first.detail.startswith(f"{service}.DRAResourceHealth: rpc error: code = UNIMPLEMENTED")
    assert again.at - first.at > 0.15  # tried again after the retry interval: no spin


async def test_a_kubelet_without_health_opens_no_stream(base: Path, servers: Servers) -> None:
    async with KubeletStandIn(base / "dp", base / "reg", kubernetes_version="1.35") as kubelet:
        kubelet.dra.health.retry = 0.05
        await serve_driver(base, servers)
        await kubelet.dra.wait_for_driver(DRIVER)
        await asyncio.sleep(0.3)
    assert not [e for e in kubelet.events if e.kind is EventKind.HEALTH_FAILED]


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (
            {"versions": ["v1beta1.DRAPlugin"]},
            'none of services supported by the plugin (["v1beta1.DRAPlugin"]) are supported by the '
            'kubelet (["v1.DRAPlugin"])',
        ),
        ({"versions": []}, "empty list of supported gRPC services (aka supported versions)"),
        ({"name": ""}, "plugin validation failed with err: DRA driver name is empty"),
        ({"kind": "CSIPlugin"}, "no handler registered for plugin type: CSIPlugin"),
    ],
)
async def test_a_driver_the_kubelet_refuses_is_told_why(
    base: Path, kubelet: KubeletStandIn, servers: Servers, info: dict[str, Any], message: str
) -> None:
    registration = await serve_driver(base, servers, **info)
    status = await registration.status()
    assert not status.plugin_registered
    assert status.error.startswith("RegisterPlugin error -- ")
    assert message in status.error
    if "versions" in info:
        assert f"DRA driver plugin {DRIVER} at endpoint {base / 'plugins' / 'dra.sock'}" in status.error
    assert kubelet.events[-1].kind == EventKind.REGISTER_FAILED
    assert kubelet.events[-1].detail == status.error
    assert kubelet.dra.drivers == []


async def test_one_endpoint_registers_once_and_a_second_one_is_called_instead(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    old, new = Driver(), Driver()
    assert (await (await serve_driver(base, servers, old)).status()).plugin_registered
    again = Info(dra_info(base / "plugins" / "dra.sock"))
    await servers.serve(base / "reg" / "again.sock", again)
    status = await again.status()
    endpoint = base / "plugins" / "dra.sock"
    assert not status.plugin_registered
    assert f"plugin registration failed with err: endpoint {endpoint} already registered" in status.error

    # a rolling update: the new pod's endpoint registers beside the old one and is called
    assert (await (await serve_driver(base, servers, new, socket="new.sock")).status()).plugin_registered
    assert kubelet.dra.endpoints(DRIVER) == [str(endpoint), str(base / "plugins" / "new.sock")]
    await kubelet.dra.prepare(DRIVER, [CLAIM])
    assert (len(old.requests), len(new.requests)) == (0, 1)
    os.unlink(base / "reg" / "reg-new.sock")  # the new pod's registration goes: the old one is left
    await kubelet.wait_for_event(EventKind.DEREGISTERED, DRIVER, since=0)
    await kubelet.dra.prepare(DRIVER, [CLAIM])
    assert (len(old.requests), len(new.requests)) == (1, 1)


async def test_device_plugin_sockets_are_left_alone_without_watcher_mode(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    plugin = Info(
        reg_pb2.PluginInfo(type="DevicePlugin", name="example.com/w", supported_versions=["v1beta1"])
    )
    await servers.serve(base / "reg" / "dp.sock", plugin)
    await (await serve_driver(base, servers)).status()  # handled after the first socket
    assert plugin.get_info_calls == 1
    assert plugin.statuses.empty()
    assert kubelet.resources == []
    assert [e.kind for e in kubelet.events] == [EventKind.REGISTERED]


async def test_a_watcher_mode_kubelet_takes_drivers_and_device_plugins(base: Path, servers: Servers) -> None:
    async with KubeletStandIn(base / "dp", base / "reg", watcher=True) as kubelet:
        assert (await (await serve_driver(base, servers)).status()).plugin_registered
        assert kubelet.dra.drivers == [DRIVER]


async def test_a_kubelet_restart_forgets_drivers_until_they_register_again(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    registration = await serve_driver(base, servers)
    await registration.status()
    since = len(kubelet.events)
    await kubelet.restart()
    disconnected = await kubelet.wait_for_event(EventKind.DISCONNECTED, DRIVER, since=since)
    assert disconnected.detail == "kubelet restarted"
    assert (await registration.status()).plugin_registered  # the socket was found again at start
    assert kubelet.dra.drivers == [DRIVER]
    await kubelet.dra.prepare(DRIVER, [CLAIM])


# -- prepare and unprepare ----------------------------------------------------------------------


async def test_prepare_and_unprepare_over_the_wire(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    driver = Driver()
    await (await serve_driver(base, servers, driver)).status()
    other = ("team", "uid-2", "claim-2")
    prepared = await kubelet.dra.prepare(DRIVER, [CLAIM, other])
    assert prepared == {
        "uid-1": (DraDevice(("gpu",), "node-a/gpu", "gpu-claim-1", (f"{DRIVER}/gpu=claim-1",)),),
        "uid-2": (DraDevice(("gpu",), "node-a/gpu", "gpu-claim-2", (f"{DRIVER}/gpu=claim-2",)),),
    }
    assert [(c.namespace, c.uid, c.name) for c in driver.requests[0].claims] == [CLAIM, other]
    event = await kubelet.wait_for_event(EventKind.PREPARED, DRIVER, since=0)
    assert event.detail == "default/claim-1: node-a/gpu/gpu-claim-1; team/claim-2: node-a/gpu/gpu-claim-2"

    await kubelet.dra.unprepare(DRIVER, [CLAIM])
    assert isinstance(driver.requests[1], api_pb2.NodeUnprepareResourcesRequest)
    assert (await kubelet.wait_for_event(EventKind.UNPREPARED, DRIVER, since=0)).detail == "default/claim-1"


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
async def test_every_claim_must_come_back_without_an_error(
    base: Path, kubelet: KubeletStandIn, servers: Servers, call: str
) -> None:
    driver = Driver()
    await (await serve_driver(base, servers, driver)).status()
    method = "NodePrepareResources" if call == "prepare" else "NodeUnprepareResources"
    failing = EventKind.PREPARE_FAILED if call == "prepare" else EventKind.UNPREPARE_FAILED
    driver.fail["uid-1"] = "device gone"
    driver.forget.add("uid-3")
    claims = [CLAIM, ("default", "uid-2", "fine"), ("default", "uid-3", "forgotten")]
    with pytest.raises(DraCallError) as refused:
        await getattr(kubelet.dra, call)(DRIVER, claims)
    assert str(refused.value) == (
        f"{method} failed for claim default/claim-1: device gone; "
        f"{method} left out 1 claims (default/forgotten)"
    )
    assert kubelet.events[-1][1:] == (failing, DRIVER, str(refused.value))


async def test_an_answer_for_a_claim_not_asked_for_is_an_error(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    driver = Driver()
    driver.stranger = "uid-9"
    await (await serve_driver(base, servers, driver)).status()
    with pytest.raises(
        DraCallError, match=r"^NodePrepareResources returned result for unknown claim UID uid-9$"
    ):
        await kubelet.dra.prepare(DRIVER, [CLAIM])


async def test_calls_have_the_kubelets_deadline_or_the_one_given(base: Path, servers: Servers) -> None:
    assert CALL_TIMEOUT == 45.0
    driver = Driver()
    driver.delay = 1.0
    async with KubeletStandIn(base / "dp", base / "reg", dra_call_timeout=0.1) as kubelet:
        assert kubelet.dra.call_timeout == 0.1
        await (await serve_driver(base, servers, driver)).status()
        with pytest.raises(
            DraCallError, match=r"^NodePrepareResources: rpc error: code = DeadlineExceeded desc = "
        ):
            await kubelet.dra.prepare(DRIVER, [CLAIM])
        assert await kubelet.dra.prepare(DRIVER, [CLAIM], timeout=5)
        await kubelet.wait_for_event(EventKind.PREPARE_FAILED, DRIVER, since=0)


async def test_a_driver_that_is_down_fails_the_call(
    base: Path, kubelet: KubeletStandIn, servers: Servers
) -> None:
    endpoint = base / "plugins" / "dra.sock"
    registration = Info(dra_info(endpoint))  # registers an endpoint nothing serves
    await servers.serve(base / "reg" / "reg.sock", registration)
    assert (await registration.status()).plugin_registered
    with pytest.raises(DraCallError, match=r"^NodeUnprepareResources: rpc error: code = Unavailable"):
        await kubelet.dra.unprepare(DRIVER, [CLAIM], timeout=2)


# -- the real host ------------------------------------------------------------------------------


async def test_the_hosts_driver_through_the_stand_in(base: Path) -> None:
    cluster = ClusterStandIn()
    example = ExampleBackend()
    registry = base / "reg"
    async with KubeletStandIn(base / "dp", registry) as kubelet:
        async with running_host(
            kubelet.device_plugins_dir,
            {"example": example},
            cluster=cluster,
            serve_through={"example": "dra"},
            node_name="node-a",
            dra_plugins_dir=base / "plugins",
            plugins_registry_dir=registry,
            cdi_dir=base / "cdi",
            device_release=False,
            backends={"example": {"resources": {"example.com/widget": 2}}},
        ) as host:
            endpoint = await kubelet.dra.wait_for_driver("example.com")
            assert Path(endpoint).parent == base / "plugins" / "example.com"
            await cluster.wait(lambda c: len(c.devices("example.com")) == 2)
            async with asyncio.timeout(5):  # NotifyRegistrationStatus reaches the host after GetInfo
                while not host.snapshot().resources[0].registered:
                    await asyncio.sleep(0.01)
            claim = cluster.allocate("example.com", 1)
            (device,) = (await kubelet.dra.prepare("example.com", [claim]))[claim[1]]
            assert (device.pool, device.device, device.requests) == ("node-a/widget", "widget-0", ("req",))
            assert device.cdi_ids == (f"example.com/claim-{claim[1]}=req.widget",)
            await kubelet.dra.unprepare("example.com", [claim])
            assert example.scrubbed == [("example.com/widget", ("widget-0",))]
            with pytest.raises(DraCallError, match="ResourceClaim default/gone: 404 NotFound"):
                await kubelet.dra.prepare("example.com", [("default", "uid-x", "gone")])
        await kubelet.wait_for_event(EventKind.DEREGISTERED, "example.com", since=0)  # the host stopped
