"""DRA behind gates that 1.34 and 1.35 keep off (on by default from 1.36), on the real cluster with
the gates turned on for this module where the cluster's version keeps them off.

- ``DRAExtendedResource`` (KEP-5004): a DeviceClass naming ``extendedResourceName`` lets a pod
  that asks for ``example.com/widget: 1`` be given a widget through DRA; the scheduler makes the
  claim, the kubelet prepares it with the host like any other.
- ``ResourceHealthStatus``: the kubelet streams device health from the host's
  DRAResourceHealth service into the pod's status (``allocatedResourcesStatus``).

Where needed the gates go on for the API server, controller-manager, scheduler and kubelet at
the start and off again at the end (the kit starts them without any).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from drahost import DraHost, dra_config
from k8skit import ClusterDra, Kit, dra_gates, pod_manifest, until

REPO = Path(__file__).resolve().parents[2]
GATES = ("DRAExtendedResource", "ResourceHealthStatus")
LABEL = {"devicehost-e2e": "dra-gates"}
GIZMO_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gizmo.gizmos.example.org"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gizmos.example.org"'}}]},
}


def host_config(node: str, unhealthy: list[str]) -> dict[str, Any]:
    backends: dict[str, dict[str, Any]] = {
        "example": {"resources": {"example.com/widget": 2}},
        "gizmo": {"count": 2, "unhealthy": unhealthy},
    }
    return dra_config(node, backends, health_interval=1)


@pytest.fixture(scope="module")
def gated(kit: Kit, dra_cluster: ClusterDra) -> Iterator[Kit]:
    with dra_gates(kit, dra_cluster, "dra-gates", GATES):
        yield kit


@pytest.fixture(scope="module")
def host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    kit = gated
    tmp = tmp_path_factory.mktemp("dra-gates")
    node = kit.node()["metadata"]["name"]
    widget_class = yaml.safe_load((REPO / "deploy/components/dra/deviceclass.yaml").read_text())
    widget_class["spec"]["extendedResourceName"] = "example.com/widget"
    kit.apply(widget_class)
    kit.apply(GIZMO_CLASS)
    host = DraHost.configured(tmp / "config.yaml", tmp / "host.log", host_config(node, [])).start()
    try:
        until(lambda: len(host.events("registered with the kubelet")) == 2, "both drivers registered", 60)
        yield host
    finally:  # pods first: the kubelet unprepares their claims through the host
        kit.kubectl("delete", "pods", "-l", "devicehost-e2e=dra-gates", "--ignore-not-found", "--wait=true")
        host.stop()
        kit.kubectl("delete", "resourceclaimtemplate", "one-gizmo", "--ignore-not-found")
        kit.kubectl(
            "delete", "deviceclass", "widget.example.com", "gizmo.gizmos.example.org", "--ignore-not-found"
        )


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return pod_manifest(name, "localhost/envsleep:v1", LABEL, **spec)


def test_a_pod_asking_for_the_extended_resource_gets_a_widget_through_dra(gated: Kit, host: DraHost) -> None:
    kit = gated
    started = time.monotonic()
    kit.run_pod(pod("extended", container={"resources": {"limits": {"example.com/widget": 1}}}), within=120)
    kit.timings["DRA extended resource: pod created -> running"] = round(time.monotonic() - started, 2)
    (prepared,) = [e for e in host.events("claim prepared") if e["driver"] == "example.com"]
    claims = kit.get("resourceclaims", "-n", "default")["items"]
    (claim,) = [c for c in claims if c["metadata"]["uid"] == prepared["uid"]]
    assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == "example.com"
    # no device plugin offers widgets here (a count left from earlier device plugin runs is 0)
    assert int(kit.node()["status"].get("allocatable", {}).get("example.com/widget", 0)) == 0
    kit.kubectl("delete", "pod", "extended", "--wait=true")
    until(lambda: host.events("claim unprepared"), "the scheduler's claim unprepared", within=60)


def test_an_unhealthy_device_shows_in_the_pod_status(gated: Kit, host: DraHost) -> None:
    kit = gated
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gizmo", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gizmo", "exactly": {"deviceClassName": "gizmo.gizmos.example.org"}}
                    ]
                }
            }
        },
    }
    kit.apply(template)
    kit.run_pod(
        pod(
            "gizmo-user",
            resourceClaims=[{"name": "gizmo", "resourceClaimTemplateName": "one-gizmo"}],
            container={"resources": {"claims": [{"name": "gizmo"}]}},
        ),
        within=120,
    )
    (prepared,) = [e for e in host.events("claim prepared") if e["driver"] == "gizmos.example.org"]
    gizmo = prepared["devices"][0]

    def health() -> dict[str, str]:
        statuses = kit.get("pod", "gizmo-user")["status"].get("containerStatuses", [])
        found = {}
        for status in statuses:
            for resource in status.get("allocatedResourcesStatus") or []:
                for entry in resource.get("resources") or []:
                    found[entry["resourceID"]] = entry.get("health", "")
        return found

    # the kubelet names a device in the pod status by the CDI ID the host answered for it
    device_id = f"gizmos.example.org/claim-{prepared['uid']}=gizmo.gizmo"  # <request>.<class>
    until(lambda: health().get(device_id) == "Healthy", f"{device_id} Healthy in the pod status", within=60)
    started = time.monotonic()
    host.reload(host_config(kit.node()["metadata"]["name"], [gizmo]))
    until(
        lambda: health().get(device_id) == "Unhealthy", f"{device_id} Unhealthy in the pod status", within=60
    )
    kit.timings["DRA health: device unhealthy -> pod status says so"] = round(time.monotonic() - started, 2)
