"""A claim's whole life through DRA, on the real host with the example backend: the slice is
published, the driver registers, a claim is prepared (CDI spec, checkpoint), asked again,
unprepared (release hook), and the slices go when the host stops; a restart keeps claims."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

import devicehost
from devicehost import Health, TaintEffect
from devicehost.host.daemon import Host
from devicehost.proto.drahealth.v1alpha1 import api_pb2 as health_pb2
from devicehost.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devicehost.standin.kubelet import KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint, unprepare
from devicehost.testing.host import running_host
from devicehost_example import ExampleBackend

DRIVER = "example.com"
SLICE = "node-a-example.com-widget"


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as tmp:  # short socket paths
        yield Path(tmp)


@asynccontextmanager
async def dra_host(
    root: Path, cluster: ClusterStandIn, backend: ExampleBackend | None = None, **settings: Any
) -> AsyncIterator[Host]:
    (root / "dp").mkdir(exist_ok=True)
    (root / "registry").mkdir(exist_ok=True)  # the kubelet's plugin watcher dir
    async with (
        KubeletStandIn(root / "dp", root / "registry"),
        running_host(
            root / "dp",
            {"example": backend or ExampleBackend()},
            cluster=cluster,
            serve_through={"example": "dra"},
            node_name="node-a",
            dra_plugins_dir=root / "plugins",
            plugins_registry_dir=root / "registry",
            cdi_dir=root / "cdi",
            device_release=False,
            backends={"example": {"resources": {"example.com/widget": 4}}},
            **settings,
        ) as host,
    ):
        yield host


def registration_socket(root: Path) -> Path:
    (found,) = (root / "registry").glob("devicehost-example.com-*.sock")
    return found


async def published(cluster: ClusterStandIn, count: int) -> dict[str, Any]:
    await cluster.wait(lambda c: SLICE in c.stored and len(c.stored[SLICE]["spec"]["devices"]) == count)
    return cluster.stored[SLICE]


async def test_a_claim_from_slice_to_release(root: Path) -> None:
    cluster = ClusterStandIn()
    example = ExampleBackend()
    async with dra_host(root, cluster, example) as host:
        body = await published(cluster, 4)
        assert body["spec"]["pool"] == {"name": "node-a/widget", "generation": 1, "resourceSliceCount": 1}
        assert body["metadata"]["ownerReferences"][0]["kind"] == "Node"
        assert body["spec"]["devices"][0] == {
            "name": "widget-0",
            "attributes": {
                "id": {"string": "widget-0"},
                "numaNode": {"int": 0},
                "resource.kubernetes.io/numaNode": {"int": 0},
            },
        }
        info = await registered_endpoint(registration_socket(root))
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DRAPlugin",
            DRIVER,
            ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"],
        )
        assert Path(info.endpoint).parent == root / "plugins" / DRIVER

        claim = cluster.allocate(DRIVER, 2, name="pair")
        answer = (await prepare(info.endpoint, [claim])).claims[claim[1]]
        assert answer.error == ""
        kind = f"{DRIVER}/claim-{claim[1]}"
        assert [(d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices] == [
            ("node-a/widget", "widget-0", [f"{kind}=req.widget"]),
            ("node-a/widget", "widget-1", []),
        ]
        assert not any(d.HasField("share_id") for d in answer.devices)  # held whole: no share
        spec = json.loads((root / "cdi" / f"devicehost-{DRIVER}_claim-{claim[1]}.json").read_text())
        assert spec["devices"][0]["containerEdits"]["env"] == ["EXAMPLE_WIDGETS=widget-0,widget-1"]
        again = (await prepare(info.endpoint, [claim])).claims[claim[1]]
        assert again == answer  # idempotent: the same answer, no second allocate
        state = host.snapshot().resources[0]
        assert state.dra is not None
        assert state.dra.prepared_claims == 1
        assert state.dra.only
        assert state.socket == ""  # no device plugin socket when served through DRA only

        done = (await unprepare(info.endpoint, [claim])).claims[claim[1]]
        assert done.error == ""
        assert example.scrubbed == [("example.com/widget", ("widget-0", "widget-1"))]
        assert not list((root / "cdi").glob("*claim*"))
        checkpoint = json.loads((root / "plugins" / DRIVER / "devicehost-claims.json").read_text())
        assert checkpoint["claims"] == {}
        assert (await unprepare(info.endpoint, [claim])).claims[claim[1]].error == ""  # again: nothing to do

        cluster.delete(SLICE)  # as a starting kubelet does
        await published(cluster, 4)
    assert cluster.stored == {}  # withdrawn when the host stops
    assert not (root / "registry").exists() or not list((root / "registry").iterdir())


async def test_claims_that_cannot_be_prepared_say_why(root: Path) -> None:
    cluster = ClusterStandIn()
    async with dra_host(root, cluster):
        await published(cluster, 4)
        endpoint = (await registered_endpoint(registration_socket(root))).endpoint
        claim = cluster.allocate(DRIVER, 1)
        answers = await prepare(
            endpoint, [("default", "no-such-uid", "missing"), claim, (claim[0], "other-uid", claim[2])]
        )
        assert "missing: 404 NotFound" in answers.claims["no-such-uid"].error
        assert answers.claims[claim[1]].error == ""  # one claim's failure leaves the others alone
        assert "has UID" in answers.claims["other-uid"].error


async def test_a_restarted_host_keeps_prepared_claims(root: Path) -> None:
    cluster = ClusterStandIn()
    async with dra_host(root, cluster):
        await published(cluster, 4)
        endpoint = (await registered_endpoint(registration_socket(root))).endpoint
        claim = cluster.allocate(DRIVER, 1)
        first = (await prepare(endpoint, [claim])).claims[claim[1]]
    async with dra_host(root, cluster) as host:
        await published(cluster, 4)
        endpoint = (await registered_endpoint(registration_socket(root))).endpoint
        assert (await prepare(endpoint, [claim])).claims[claim[1]] == first
        assert host.snapshot().resources[0].dra.prepared_claims == 1  # type: ignore[union-attr]
        assert (await unprepare(endpoint, [claim])).claims[claim[1]].error == ""


async def test_health_reaches_the_kubelet_stream_and_the_slice(root: Path) -> None:
    cluster = ClusterStandIn()
    example = ExampleBackend()
    async with dra_host(root, cluster, example):
        await published(cluster, 4)
        endpoint = (await registered_endpoint(registration_socket(root))).endpoint
        async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
            stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest()
            )
            first = await stream.read()
            assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices][:2] == [
                ("node-a/widget", "widget-0", health_pb2.HEALTHY),
                ("node-a/widget", "widget-1", health_pb2.HEALTHY),
            ]
            example.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.UNHEALTHY)
            update = await asyncio.wait_for(stream.read(), 5)
            assert {d.device.device_name: d.health for d in update.devices}[
                "widget-1"
            ] == health_pb2.UNHEALTHY
            body = await published(cluster, 3)  # withdrawn from the slice while unhealthy
            assert "widget-1" not in [d["name"] for d in body["spec"]["devices"]]
            assert body["spec"]["pool"]["generation"] == 2
            example.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.HEALTHY)
            await published(cluster, 4)
            stream.cancel()


class SharedWidgets(ExampleBackend):
    """The example backend, its widgets allowing multiple allocations (consumable capacity)."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [
            dataclasses.replace(
                r, devices=tuple(dataclasses.replace(d, allow_multiple_allocations=True) for d in r.devices)
            )
            for r in super().devicehost_discover()
        ]


async def test_each_share_reaches_the_kubelet_with_its_share_id(root: Path) -> None:
    cluster = ClusterStandIn()
    async with dra_host(root, cluster, SharedWidgets()):
        await published(cluster, 4)
        endpoint = (await registered_endpoint(registration_socket(root))).endpoint
        claims = [cluster.allocate(DRIVER, devices=["widget-0"]) for _ in range(2)]
        answers = (await prepare(endpoint, claims)).claims
        received = [answers[uid].devices[0].share_id for _, uid, _ in claims]
    wanted = [cluster.claims[(ns, name)].devices[0].share_id for ns, _, name in claims]
    assert received == wanted
    assert len(set(received)) == 2  # two shares of one device, told apart
    assert all(wanted)


class TaintChoosingBackend(ExampleBackend):
    """The example backend, its widgets declaring the taint effect their unhealthy devices get."""

    def __init__(self, effect: TaintEffect) -> None:
        super().__init__()
        self.effect: TaintEffect = effect

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [dataclasses.replace(r, unhealthy_taint=self.effect) for r in super().devicehost_discover()]


@pytest.mark.parametrize(
    ("chosen", "operator", "effect"),
    [("NoExecute", {}, "NoExecute"), ("NoExecute", {"dra_unhealthy_taint": "NoSchedule"}, "NoSchedule"),
     ("none", {}, None)],
)  # fmt: skip
async def test_the_backend_chooses_the_taint_effect_unless_the_operator_does(
    root: Path, chosen: TaintEffect, operator: dict[str, str], effect: str | None
) -> None:
    cluster = ClusterStandIn()
    cluster.device_taints_kept = True
    backend = TaintChoosingBackend(chosen)
    async with dra_host(root, cluster, backend, **operator):
        await published(cluster, 4)
        backend.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.UNHEALTHY)
        if effect is None:  # withdrawn, not tainted
            body = await published(cluster, 3)
            assert all("taints" not in d for d in body["spec"]["devices"])
            return
        await cluster.wait(lambda c: any("taints" in d for d in c.stored[SLICE]["spec"]["devices"]))
        (taint,) = {d["name"]: d for d in cluster.stored[SLICE]["spec"]["devices"]}["widget-1"]["taints"]
        assert taint["effect"] == effect


async def test_an_unhealthy_device_keeps_its_place_with_a_taint_where_the_api_has_taints(root: Path) -> None:
    cluster = ClusterStandIn()
    cluster.device_taints_kept = True
    example = ExampleBackend()
    async with dra_host(root, cluster, example, dra_unhealthy_taint="NoExecute"):
        await published(cluster, 4)
        example.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.UNHEALTHY)

        def tainted(c: ClusterStandIn) -> bool:
            return any("taints" in d for d in c.stored[SLICE]["spec"]["devices"])

        await cluster.wait(tainted)
        devices = {d["name"]: d for d in cluster.stored[SLICE]["spec"]["devices"]}
        assert len(devices) == 4  # still published: sick, not gone
        (taint,) = devices["widget-1"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            "devicehost.io/unhealthy",
            "true",
            "NoExecute",
        )
        assert taint["timeAdded"].endswith("Z")
        assert "taints" not in devices["widget-0"]
        example.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.HEALTHY)
        await cluster.wait(lambda c: not tainted(c))
        assert len(cluster.stored[SLICE]["spec"]["devices"]) == 4


async def test_where_the_api_drops_taints_an_unhealthy_device_is_withdrawn(root: Path) -> None:
    cluster = ClusterStandIn()  # an API server without DRADeviceTaints: drops the field
    example = ExampleBackend()
    async with dra_host(root, cluster, example):
        await published(cluster, 4)
        writes = cluster.stored[SLICE]["metadata"]["resourceVersion"]
        example.devicehost_conformance_set_health("example.com/widget", "widget-1", Health.UNHEALTHY)
        body = await published(cluster, 3)
        assert "widget-1" not in [d["name"] for d in body["spec"]["devices"]]
        await asyncio.sleep(0.3)  # and it is not rewritten again and again
        assert int(cluster.stored[SLICE]["metadata"]["resourceVersion"]) == int(writes) + 1
