"""The DRA suite's core against the stand-ins at each Kubernetes version, 1.34 to 1.37: the host
finds what the API server serves (one log line, ``/status``), a claim is prepared, and a device's
health reaches the kubelet (through the health stream of that kubelet's version, as the pod's
``allocatedResourcesStatus``), the slice (a taint, or withdrawal where the API drops taints) and
the device plugin side, and recovers on all three. Last, what the e2e suite turns on for a real
cluster of each version (tests/support/k8skit.py's ClusterDra)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from k8skit import ClusterDra

from devicehost import Health
from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.ops.status import document
from devicehost.standin import EventKind, KubeletStandIn
from devicehost.standin.versions import VERSIONS, parse
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host
from devicehost_example import ExampleBackend

DRIVER = "example.com"
RESOURCE = "example.com/widget"
SLICE = "node-a-example.com-widget"
WHY = "widget-0: ECC errors over the limit"


class FaultyWidgets(ExampleBackend):
    """The example backend, able to report its widgets unhealthy with a message."""

    def fault(self, ids: set[str], message: str) -> None:
        """``ids`` unhealthy with ``message`` (the others healthy); no ids: all repaired."""
        (resource,) = self.devicehost_discover()
        devices = [
            dataclasses.replace(d, health=Health.UNHEALTHY, health_message=message) if d.id in ids else d
            for d in resource.devices
        ]
        self._notifiers[RESOURCE].set_devices(devices)


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dver"))  # short socket paths
    yield path
    shutil.rmtree(path)


def slice_devices(cluster: ClusterStandIn) -> dict[str, Any]:
    return {d["name"]: d for d in cluster.stored.get(SLICE, {}).get("spec", {}).get("devices", [])}


async def until(predicate: Any, timeout: float = 10) -> None:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_claim_and_its_device_health_at_each_version(base: Path, version: str) -> None:
    surface = parse(version)
    cluster = ClusterStandIn(version)
    backend = FaultyWidgets()
    with structlog.testing.capture_logs() as logs:
        async with (
            KubeletStandIn(base / "dp", base / "reg", kubernetes_version=version) as kubelet,
            running_host(
                kubelet.device_plugins_dir,
                {"example": backend},
                cluster=cluster,
                serve_through={"example": "both"},
                node_name="node-a",
                dra_plugins_dir=base / "plugins",
                plugins_registry_dir=base / "reg",
                cdi_dir=base / "cdi",
                device_release=False,
                backends={"example": {"resources": {RESOURCE: 4}}},
            ) as host,
        ):
            await kubelet.dra.wait_for_driver(DRIVER)
            await cluster.wait(lambda c: len(c.devices(DRIVER)) == 4)
            await until(lambda: host.snapshot().resources[0].dra.cluster is not None)  # type: ignore[union-attr]
            seen = host.snapshot().resources[0].dra.cluster  # type: ignore[union-attr]
            assert seen is not None
            assert seen.versions == ("v1",)
            assert seen.features["device taints in slices"] == surface.enabled("DRADeviceTaints")
            assert seen.features["consumable capacity"] == surface.enabled("DRAConsumableCapacity")
            assert seen.features["binding conditions"] == surface.enabled("DRADeviceBindingConditions")
            shown = json.loads(json.dumps(document(host.snapshot())))["resources"][RESOURCE]["dra"]  # /status
            assert shown["cluster"]["versions"] == ["v1"]
            assert shown["cluster"]["features"] == seen.features
            assert "calls" not in shown  # the metrics' business

            claim = cluster.allocate(DRIVER, devices=["widget-0"], name="gpu")
            (device,) = (await kubelet.dra.prepare(DRIVER, [claim]))[claim[1]]
            assert device.device == "widget-0"
            await kubelet.wait_for_resource(RESOURCE, healthy=3)  # the claim's widget is masked there

            backend.fault({"widget-0", "widget-1"}, WHY)
            await kubelet.wait_for_resource(RESOURCE, healthy=2)  # the device plugin side
            cdi_id = f"{DRIVER}/claim-{claim[1]}=req.widget"  # the kubelet names a device by its CDI ID
            expected_status = {"resourceID": cdi_id, "health": "Unhealthy", "message": WHY}
            if surface.health_service is not None:
                await until(
                    lambda: (
                        kubelet.dra.health.allocated_resources_status([claim])[0]["resources"][0]
                        == expected_status
                    )
                )
            else:  # no health stream: the kubelet knows nothing of it
                assert (
                    kubelet.dra.health.allocated_resources_status([claim])[0]["resources"][0]["health"]
                    == "Unknown"
                )
            if surface.enabled("DRADeviceTaints"):
                await until(lambda: "taints" in slice_devices(cluster).get("widget-1", {}))
                assert slice_devices(cluster)["widget-1"]["taints"][0]["key"] == "devicehost.io/unhealthy"
            else:
                await until(lambda: "widget-1" not in slice_devices(cluster))

            backend.fault(set(), "")
            await kubelet.wait_for_resource(RESOURCE, healthy=3)
            await until(
                lambda: (
                    len(slice_devices(cluster)) == 4
                    and not any("taints" in d for d in slice_devices(cluster).values())
                )
            )
            if surface.health_service is not None:
                await until(
                    lambda: (
                        kubelet.dra.health.allocated_resources_status([claim])[0]["resources"][0]["health"]
                        == "Healthy"
                    )
                )
            await kubelet.dra.unprepare(DRIVER, [claim])
            del cluster.claims[(claim[0], claim[2])]  # its pod ended: the claim goes, and its hold
            await kubelet.wait_for_resource(RESOURCE, healthy=4)
            metrics = HostMetrics()
            metrics.watch(host.snapshot)
            scraped = metrics.render().decode().splitlines()
            failed = [e for e in kubelet.events if e.kind is EventKind.HEALTH_FAILED]
    assert failed == []  # the host serves every health version a kubelet opens
    for line in (
        'devicehost_prepare_claims_total{driver="example.com",result="success"} 1.0',
        'devicehost_unprepare_claims_total{driver="example.com",result="success"} 1.0',
        'devicehost_prepare_claim_duration_seconds_count{driver="example.com",result="success"} 1.0',
        'devicehost_dra_health_transitions_total{driver="example.com",health="Unhealthy"} 2.0',
        'devicehost_dra_health_transitions_total{driver="example.com",health="Healthy"} 2.0',
    ):
        assert line in scraped
    writes = next(
        x for x in scraped if x.startswith('devicehost_dra_slice_writes_total{driver="example.com"}')
    )
    assert float(writes.rpartition(" ")[2]) >= 3  # published, the fault, the repair
    said = [e for e in logs if e["event"] == "the API server serves DRA"]
    assert len(said) == 1
    assert said[0]["versions"] == "v1"


@pytest.mark.parametrize(
    ("version", "served", "gates", "api", "runtime_config"),
    [
        ("1.35", {"v1"}, {"DRADeviceTaints": True, "DRADeviceTaintRules": True}, "v1alpha3",
         {"resource.k8s.io/v1alpha3": True}),
        ("1.36", {"v1"}, {"DRADeviceTaintRules": True}, "v1beta2", {"resource.k8s.io/v1beta2": True}),
        ("1.36", {"v1", "v1beta2"}, {"DRADeviceTaintRules": True}, "v1beta2", {}),
        ("1.37", {"v1"}, {}, "v1", {}),
    ],
)  # fmt: skip
def test_the_e2e_suite_turns_on_only_what_the_clusters_version_lacks(
    version: str, served: set[str], gates: dict[str, bool], api: str, runtime_config: dict[str, bool]
) -> None:
    cluster = ClusterDra(parse(version), frozenset(served))
    assert cluster.gates("DRADeviceTaints", "DRADeviceTaintRules") == gates
    assert cluster.taint_rule_api == api
    assert cluster.runtime_config(cluster.taint_rule_api) == runtime_config
