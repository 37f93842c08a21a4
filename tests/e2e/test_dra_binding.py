"""Binding conditions and claim status (issue 25 item 5) on the real cluster: dra-example with
``binding_conditions`` on, the reference's binding-conditions scenario.

The host serves one GPU published with the reference's condition names (``bindingConditions:
[BindingConditions]``, ``bindingFailureConditions: [BindingFailureConditions]``). The backend
says the GPU is ready only once a file exists (``binding_ready_file``): until then the scheduler
has allocated the claim but holds the pod unbound (no ``nodeName``), and the claim's status shows
the host's ``BindingConditions=False`` (reason ``Attaching``); once the file is there the host
writes it True (reason ``Ready``), the scheduler binds the pod, the kubelet prepares the claim,
the host adds the GPU's ``data`` (``device_status``), and the container prints its GPU.

In 1.34 and 1.35 DRADeviceBindingConditions is alpha and off (beta and on from 1.36); it needs
DRAResourceClaimDeviceStatus (on by default). Without the gate the API server drops the fields
from a slice, with it (by default from 1.36) it keeps them (checked here with a dry-run create
before and after); a device with binding conditions needs no ``bindsToNode``. Where the cluster's
version keeps the gate off it is on for the API server, controller-manager, scheduler and kubelet
for this module and off after it. Times go to ``kit.timings``, the claim status and the container's
GPU lines to ``kit.notes``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from drahost import DraHost, container_env, driver_slices, since, wait_running
from k8skit import ClusterDra, Kit, dra_gates, until

REPO = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).resolve().parent / "manifests" / "gpu-binding-conditions.yaml"
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
DRIVER = "gpu.example.com"
NAMESPACE = "gpu-binding-conditions"
GATE = "DRADeviceBindingConditions"
HELD = 15.0
"""Seconds the pod is checked to stay unbound while the backend says the GPU is not ready."""
CONDITIONS = {
    "bindingConditions": ["BindingConditions"],
    "bindingFailureConditions": ["BindingFailureConditions"],
}


def probe_slice(node: str) -> dict[str, Any]:
    """A slice of one device with binding conditions (and no bindsToNode), to create as a dry run."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "devicehost-binding-probe"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": f"{node}/binding-probe", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "probe", **CONDITIONS}],
        },
    }


def kept_by_api_server(kit: Kit) -> dict[str, Any]:
    """The probe device as the API server would store it."""
    node = kit.node()["metadata"]["name"]
    out = kit.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(probe_slice(node))
    )
    device: dict[str, Any] = json.loads(out)["spec"]["devices"][0]
    return device


def gates_enabled(kit: Kit) -> list[str]:
    """The API server's own word on the two gates (its kubernetes_feature_enabled metric)."""
    metrics = kit.kubectl("get", "--raw", "/metrics", timeout=30).splitlines()
    names = ("DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus")
    return [
        ln
        for ln in metrics
        if ln.startswith("kubernetes_feature_enabled") and any(f'"{n}"' in ln for n in names)
    ]


@pytest.fixture(scope="module")
def gated(kit: Kit, dra_cluster: ClusterDra) -> Iterator[Kit]:
    """DRADeviceBindingConditions on for this module (the API server drops the fields before,
    unless the cluster's version has the gate on by default)."""
    before = kept_by_api_server(kit)
    kit.notes.append(f"dra-binding before: {gates_enabled(kit)}; a dry-run slice device keeps {before}")
    assert ("bindingConditions" in before) == dra_cluster.version.enabled(GATE), before
    with dra_gates(kit, dra_cluster, "dra-binding", [GATE]):
        after = kept_by_api_server(kit)
        kit.notes.append(f"dra-binding gate on: {gates_enabled(kit)}; a dry-run slice device keeps {after}")
        assert {k: after.get(k) for k in CONDITIONS} == CONDITIONS, after
        yield kit


@pytest.fixture(scope="module")
def ready_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dra-binding-ready") / "gpu-ready"


@pytest.fixture(scope="module")
def host(gated: Kit, ready_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    kit = gated
    node = kit.node()["metadata"]["name"]
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
    settings = {
        "dra-example": {
            "num_gpus": 1,
            "binding_conditions": True,
            "binding_ready_file": str(ready_file),
            "device_status": True,
        }
    }
    log = tmp_path_factory.mktemp("dra-binding") / "host.log"
    started = time.monotonic()
    gpu_host = DraHost.backend("dra-example", node, log, settings).start()
    try:
        gpu_host.ready(lambda: driver_slices(kit, DRIVER) or None, "the GPU slice published")
        kit.timings["dra-binding: host start -> slice published"] = since(started)
        yield gpu_host
    finally:
        kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
        gpu_host.stop()
        kit.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found")
        gpu_host.finish(kit, "dra-binding")


def claim_of(kit: Kit, pod: str) -> dict[str, Any] | None:
    """The pod's claim (made from its template), once the pod names it."""
    statuses = kit.get("pod", "-n", NAMESPACE, pod).get("status", {}).get("resourceClaimStatuses", [])
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    found: dict[str, Any] = kit.get("resourceclaim", "-n", NAMESPACE, statuses[0]["resourceClaimName"])
    return found


def condition(claim: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The condition ``kind`` of the claim's first device status, as the API server shows it."""
    for device in claim.get("status", {}).get("devices", []):
        for found in device.get("conditions", []):
            if found["type"] == kind:
                return dict(found)
    return None


def test_the_slice_carries_the_binding_conditions(kit: Kit, host: DraHost) -> None:
    (gpu_slice,) = driver_slices(kit, DRIVER)
    (device,) = gpu_slice["spec"]["devices"]
    assert device["name"] == "gpu-0", device
    assert {k: device.get(k) for k in CONDITIONS} == CONDITIONS, device
    assert "bindsToNode" not in device, device
    kit.notes.append(f"dra-binding slice device gpu-0: {json.dumps({k: device[k] for k in CONDITIONS})}")


def test_the_pod_binds_only_once_the_backend_reports_ready(kit: Kit, host: DraHost, ready_file: Path) -> None:
    ready_file.unlink(missing_ok=True)
    started = time.monotonic()
    kit.apply_all([d for d in yaml.safe_load_all(MANIFEST.read_text()) if d])

    def waiting() -> dict[str, Any] | None:
        claim = claim_of(kit, "pod0")
        found = claim and condition(claim, "BindingConditions")
        return claim if found and found["status"] == "False" else None

    claim = until(waiting, "the claim allocated and BindingConditions=False written by the host", within=90)
    kit.timings["dra-binding: applied -> claim allocated, condition False"] = since(started)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["device"], result["driver"]) == ("gpu-0", DRIVER), result
    assert {k: result.get(k) for k in CONDITIONS} == CONDITIONS, result
    held = condition(claim, "BindingConditions")
    kit.notes.append(
        f"dra-binding while not ready: claim {claim['metadata']['name']} status.devices {json.dumps(claim['status']['devices'])}"
    )
    assert held is not None, claim["status"]
    assert held["reason"] == "Attaching", held

    deadline = time.monotonic() + HELD
    while time.monotonic() < deadline:  # the scheduler holds the pod while the GPU is not ready
        pod = kit.get("pod", "-n", NAMESPACE, "pod0")
        assert not pod["spec"].get("nodeName"), pod["spec"]
        assert pod["status"].get("phase") == "Pending", pod["status"]
        time.sleep(1)
    kit.notes.append(f"dra-binding: pod0 unbound (no nodeName, Pending) for {HELD:g} s while not ready")

    ready_file.write_text("ready\n")
    released = time.monotonic()
    wait_running(kit, NAMESPACE, ["pod0"], within=120)
    kit.timings["dra-binding: backend ready -> pod0 running"] = since(released)
    pod = kit.get("pod", "-n", NAMESPACE, "pod0")
    assert pod["spec"].get("nodeName") == kit.node()["metadata"]["name"], pod["spec"]

    def prepared() -> dict[str, Any] | None:
        found = claim_of(kit, "pod0")
        devices = (found or {}).get("status", {}).get("devices", [])
        return found if devices and devices[0].get("data") else None

    claim = until(prepared, "the GPU's data in the claim's status after prepare", within=30)
    (status,) = claim["status"]["devices"]
    kit.notes.append(f"dra-binding when ready: status.devices {json.dumps(claim['status']['devices'])}")
    assert (status["driver"], status["device"]) == (DRIVER, "gpu-0"), status
    ready = condition(claim, "BindingConditions")
    assert ready is not None, status
    assert (ready["status"], ready["reason"], ready["message"]) == ("True", "Ready", "Device is ready"), ready
    assert status["data"]["model"] == "LATEST-GPU-MODEL", status
    assert status["data"]["uuid"].startswith("gpu-"), status
    assert status["data"]["driverVersion"] == "1.0.0", status

    env = container_env(kit, "dra-binding", NAMESPACE, "pod0", "ctr0", DRIVER)
    assert env.get("GPU_DEVICE_0") == "gpu-0", env
    assert env.get("GPU_DEVICE_0_SHARING_STRATEGY") == "TimeSlicing", env
