"""Consumable capacity (issue 25 item 3) on the real cluster: devices many claims share.

The reference driver's three scenarios, with devicehost-dra-example (``gpu_allow_multiple_allocations``)
and devicehost-dra-example-net served by one host: two claims of 16Gi and 20 compute share gpu-0,
two claims of bandwidth share nic-0, and with ``gpu_partitions=2`` two claims of 8Gi and 10 share
one partition. Each container must show the device, the capacity its claim took and its own share
ID, the one the scheduler wrote into the claim's allocation. The scheduler, not the host, keeps the
shares within the capacity: a claim for more than is left stays Pending.

DRAConsumableCapacity is alpha in 1.35 and DRAPartitionableDevices beta and off (both on by
default from 1.36); where the cluster's version keeps them off they are turned on for this module
and off again after it (without the first the API server drops ``allowMultipleAllocations`` and
the capacity requests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from allocations import observed, record, record_refusal
from drahost import DraHost, container_env, driver_slices, first_event, since, wait_running
from k8skit import ClusterDra, Kit, dra_gates, until

REPO = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).resolve().parent / "manifests" / "dra-shares.yaml"
DEPLOY = REPO / "plugins" / "devicehost-dra-example" / "deploy"
CLASSES = (DEPLOY / "deviceclass.yaml", DEPLOY / "net-deviceclass.yaml")
NAMESPACE = "dra-shares"
GATES = ("DRAConsumableCapacity", "DRAPartitionableDevices")
GPU, NET = "gpu.example.com", "net.example.com"


def settings(partitions: int) -> dict[str, Any]:
    return {
        "dra-example": {"num_gpus": 1, "gpu_partitions": partitions, "gpu_allow_multiple_allocations": True},
        "dra-example-net": {"num_nics": 1},
    }


def docs(*names: str) -> list[dict[str, Any]]:
    found = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return [d for d in found if d["metadata"]["name"] in names]


def shared_devices(kit: Kit, driver: str) -> list[dict[str, Any]] | None:
    """The driver's published devices once they all allow multiple allocations."""
    devices = [d for s in driver_slices(kit, driver) for d in s["spec"].get("devices", [])]
    return devices if devices and all(d.get("allowMultipleAllocations") for d in devices) else None


def start_host(kit: Kit, partitions: int, log: Path) -> DraHost:
    node = kit.node()["metadata"]["name"]
    started = time.monotonic()
    host = DraHost.backend("dra-example,dra-example-net", node, log, settings(partitions)).start()
    wanted = partitions + 1 if partitions else 1  # the partitions and the full GPU
    try:
        host.ready(
            lambda: (len(shared_devices(kit, GPU) or ()) == wanted and shared_devices(kit, NET)) or None,
            "the shared GPU devices and the NIC published",
        )
    except BaseException:
        host.stop()  # never left running to publish beside the next host
        raise
    kit.timings[f"dra-shares: host start (gpu_partitions={partitions}) -> published"] = since(started)
    return host


def delete_pods(kit: Kit, *pods: str) -> None:
    kit.kubectl("delete", "pods", "-n", NAMESPACE, *pods, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture(scope="module")
def gated(kit: Kit, dra_cluster: ClusterDra) -> Iterator[Kit]:
    with dra_gates(kit, dra_cluster, "dra-shares", GATES):
        for path in CLASSES:
            kit.kubectl("apply", "-f", str(path))
        kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
        kit.apply_all(docs(NAMESPACE))
        try:
            yield kit
        finally:
            kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
            kit.kubectl("delete", "deviceclass", GPU, NET, "--ignore-not-found")


@pytest.fixture(scope="module")
def host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    log = tmp_path_factory.mktemp("dra-shares") / "host.log"
    served = start_host(gated, 0, log)
    try:
        yield served
    finally:
        if served.running():
            delete_pods(gated, "--all")
        served.stop()
        served.finish(gated, "dra-shares")


def allocation(kit: Kit, claim: str) -> dict[str, Any]:
    """The claim's one allocated result (device, shareID, consumedCapacity)."""
    found = kit.get("resourceclaim", "-n", NAMESPACE, claim)
    (result,) = found["status"]["allocation"]["devices"]["results"]
    return dict(result)


def pod_claim(kit: Kit, pod: str) -> str:
    status = kit.get("pod", "-n", NAMESPACE, pod)["status"]
    return str(status["resourceClaimStatuses"][0]["resourceClaimName"])


def run_pair(kit: Kit, what: str, claims: tuple[str, ...], pods: tuple[str, str]) -> list[dict[str, str]]:
    started = time.monotonic()
    kit.apply_all(docs(*claims, *pods))
    wait_running(kit, NAMESPACE, list(pods))
    kit.timings[f"dra-shares {what}: applied -> 2 pods running"] = since(started)
    driver = NET if what == "nic" else GPU
    record(kit, f"dra-shares {what}", observed(kit, NAMESPACE, list(pods), driver))
    return [container_env(kit, "dra-shares", NAMESPACE, pod, "ctr0", driver) for pod in pods]


def test_two_claims_share_one_gpu_each_with_its_memory_and_compute(kit: Kit, host: DraHost) -> None:
    (gpu,) = shared_devices(kit, GPU) or []
    assert gpu["capacity"]["memory"]["requestPolicy"]["validRange"] == {
        "min": "1Gi",
        "step": "1Gi",
        "max": "80Gi",
    }
    envs = run_pair(kit, "gpu", ("shared-gpu-pod0", "shared-gpu-pod1"), ("gpu-pod0", "gpu-pod1"))
    for claim, env in zip(("shared-gpu-pod0", "shared-gpu-pod1"), envs, strict=True):
        result = allocation(kit, claim)
        assert result["device"] == "gpu-0", result
        assert result["consumedCapacity"] == {"memory": "16Gi", "compute": "20"}, result
        assert (env["GPU_DEVICE_0"], env["GPU_DEVICE_0_MEMORY"], env["GPU_DEVICE_0_COMPUTE"]) == (
            "gpu-0",
            "16Gi",
            "20",
        )
        assert env["GPU_DEVICE_0_SHARE_ID"] == result["shareID"], (env, result)
    assert envs[0]["GPU_DEVICE_0_SHARE_ID"] != envs[1]["GPU_DEVICE_0_SHARE_ID"]

    # 32Gi of 80Gi are taken: a claim for 60Gi does not fit, and waits
    too_big = docs("shared-gpu-pod0")[0]
    too_big["metadata"]["name"] = "too-big"
    too_big["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "60Gi"
    pod = docs("gpu-pod0")[0]
    pod["metadata"]["name"] = "too-big-pod"
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = "too-big"
    kit.apply_all([too_big, pod])
    message = first_event(kit, NAMESPACE, "too-big-pod", "FailedScheduling")
    kit.notes.append(f"dra-shares too-big-pod (60Gi with 32Gi of gpu-0 taken): FailedScheduling: {message}")
    record_refusal(kit, "dra-shares gpu", "too-big-pod", message)
    assert kit.get("pod", "-n", NAMESPACE, "too-big-pod")["status"].get("phase") == "Pending"
    delete_pods(kit, "too-big-pod", "gpu-pod0", "gpu-pod1")
    until(lambda: len(host.events("claim unprepared")) >= 2 or None, "both GPU shares unprepared", within=60)


def test_two_claims_share_one_nic_each_with_its_bandwidth(kit: Kit, host: DraHost) -> None:
    envs = run_pair(kit, "nic", ("nic-10g-in-5g-out", "nic-5g-in-5g-out"), ("nic-pod0", "nic-pod1"))
    rates = [(e["NET_DEVICE_0"], e["NET_DEVICE_0_INGRESS_RATE"], e["NET_DEVICE_0_EGRESS_RATE"]) for e in envs]
    assert rates == [("nic-0", "10000000000", "5000000000"), ("nic-0", "5000000000", "5000000000")]
    for pod, env in zip(("nic-pod0", "nic-pod1"), envs, strict=True):
        result = allocation(kit, pod_claim(kit, pod))
        assert env["NET_DEVICE_0_SHARE_ID"] == result["shareID"], (env, result)
    assert envs[0]["NET_DEVICE_0_SHARE_ID"] != envs[1]["NET_DEVICE_0_SHARE_ID"]
    delete_pods(kit, "nic-pod0", "nic-pod1")


def test_two_claims_share_one_partition(kit: Kit, host: DraHost, tmp_path: Path) -> None:
    until(lambda: len(host.events("claim unprepared")) >= len(host.events("claim prepared")) or None,
          "every claim so far unprepared", within=60)  # fmt: skip
    host.stop()
    partitioned = start_host(kit, 2, tmp_path / "host.log")
    try:
        envs = run_pair(kit, "partition", ("shared-partition-pod0", "shared-partition-pod1"),
                        ("partition-pod0", "partition-pod1"))  # fmt: skip
        results = [allocation(kit, c) for c in ("shared-partition-pod0", "shared-partition-pod1")]
        (device,) = {r["device"] for r in results}
        assert device == "gpu-0-partition-0", results  # the claims' selector
        key = f"GPU_DEVICE_0_PARTITION_{device.rpartition('-')[2]}"
        for env, result in zip(envs, results, strict=True):
            assert (env[key], env[f"{key}_MEMORY"], env[f"{key}_COMPUTE"]) == (device, "8Gi", "10"), env
            assert env[f"{key}_SHARE_ID"] == result["shareID"]
        assert results[0]["shareID"] != results[1]["shareID"]
        delete_pods(kit, "partition-pod0", "partition-pod1")
        until(lambda: len(partitioned.events("claim unprepared")) >= 2 or None, "both shares unprepared", 60)
    finally:
        partitioned.stop()
        partitioned.finish(kit, "dra-shares-partitions")
