"""Partitionable devices (issue 25 item 2) on the real cluster: dra-example with gpu_partitions=4.

The reference driver's partitionable-devices scenario, grown into a check of the counters: with
``{"dra-example": {"num_gpus": 1, "gpu_partitions": 4}}`` the host publishes one pool whose
counter set ``gpu-0-counters`` (memory 80Gi, compute 100) is in one slice and whose 5 devices
(``gpu-0-partition-0..3`` at 20Gi/25 each, ``gpu-0-full`` at all of it) consume from it in
another. The scheduler, not the host, keeps the sum within the counters: while two partitions are
held the full GPU cannot be allocated (the pod stays Pending with FailedScheduling), two more
partitions still can (80Gi in all), and once the partition pods are gone the full GPU runs.

DRAPartitionableDevices is beta and off by default in 1.35 (on from 1.36): where the cluster's
version keeps it off it is turned on for the API server, controller-manager, scheduler and kubelet
for this module and off again after it (without it the API server drops
``sharedCounters``/``consumesCounters`` from the slices). Times to Running go to
``kit.timings``, the ``GPU_DEVICE_*`` lines each container printed to ``kit.notes``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from allocations import observed, record, record_refusal
from drahost import DraHost, container_env, driver_slices, first_event, since
from drahost import wait_running as pods_running
from k8skit import ClusterDra, Kit, dra_gates, until

REPO = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).resolve().parent / "manifests" / "gpu-partitions.yaml"
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
DRIVER = "gpu.example.com"
NAMESPACE = "gpu-partitions"
SETTINGS = {"dra-example": {"num_gpus": 1, "gpu_partitions": 4}}
GATES = ("DRAPartitionableDevices",)
PARTITIONS = [f"gpu-0-partition-{j}" for j in range(4)]
PARTITION_KEY = re.compile(r"^GPU_DEVICE_0_PARTITION_(\d+)$")


def published(kit: Kit) -> list[dict[str, Any]] | None:
    """The driver's slices once they are the partition profile's two (counters, 5 devices)."""
    slices = driver_slices(kit, DRIVER)
    devices = sum(len(s["spec"].get("devices", [])) for s in slices)
    counters = sum(len(s["spec"].get("sharedCounters", [])) for s in slices)
    return slices if (len(slices), devices, counters) == (2, 5, 1) else None


def delete_pods(kit: Kit, *pods: str) -> None:
    """Pods first, and waited for: the kubelet unprepares their claims through the host."""
    kit.kubectl("delete", "pods", "-n", NAMESPACE, *(pods or ["--all"]), "--ignore-not-found",
                "--wait=true", timeout=180)  # fmt: skip


@pytest.fixture(scope="module")
def gated(kit: Kit, dra_cluster: ClusterDra) -> Iterator[Kit]:
    """DRAPartitionableDevices on for this module where the cluster's version keeps it off; the
    kit's gates (none) again after it."""
    with dra_gates(kit, dra_cluster, "dra-partitions", GATES):
        yield kit


@pytest.fixture(scope="module")
def host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    kit = gated
    node = kit.node()["metadata"]["name"]
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
    started = time.monotonic()
    log = tmp_path_factory.mktemp("dra-partitions") / "host.log"
    gpu_host = DraHost.backend("dra-example", node, log, SETTINGS).start()
    try:
        gpu_host.ready(lambda: published(kit), "the counter slice and the 5 partition devices published")
        kit.timings["dra-partitions: host start -> pool published"] = since(started)
        yield gpu_host
    finally:
        if gpu_host.running():
            delete_pods(kit)
        kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
        gpu_host.stop()
        kit.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found")
        gpu_host.finish(kit, "dra-partitions")


def docs(*names: str) -> list[dict[str, Any]]:
    """The manifest's documents with these names (all of them without names), in file order."""
    found = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return [d for d in found if not names or d["metadata"]["name"] in names]


def pod_status(kit: Kit, pod: str) -> dict[str, Any]:
    status: dict[str, Any] = kit.get("pod", "-n", NAMESPACE, pod).get("status", {})
    return status


def wait_running(kit: Kit, pod: str, what: str, started: float, within: float = 120) -> None:
    pods_running(kit, NAMESPACE, [pod], within=within)
    kit.timings[f"dra-partitions {what}"] = since(started)


def gpu_env(kit: Kit, pod: str) -> dict[str, str]:
    """What ctr0 printed (``ENV KEY=VALUE``); its GPU lines go to the report."""
    return container_env(kit, "dra-partitions", NAMESPACE, pod, "ctr0", DRIVER)


def partitions(env: dict[str, str]) -> list[str]:
    """The partitions a container was given: ``GPU_DEVICE_0_PARTITION_<j>=gpu-0-partition-<j>``."""
    found = []
    for key, value in env.items():
        match = PARTITION_KEY.match(key)
        if match:
            assert value == f"gpu-0-partition-{match[1]}", f"{key}={value}"
            found.append(value)
    assert not [k for k in env if re.match(r"^GPU_DEVICE_\d+(_FULL)?$", k)], env  # no whole GPU
    return sorted(found)


def allocated(kit: Kit, pod: str) -> list[str]:
    """The devices the scheduler allocated to the pod's claim."""
    name = pod_status(kit, pod)["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = kit.get("resourceclaim", "-n", NAMESPACE, name)
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def test_the_pool_has_a_counter_slice_and_a_device_slice(kit: Kit, host: DraHost) -> None:
    slices = until(lambda: published(kit), "the partition pool", within=30)
    pools = {s["spec"]["pool"]["name"] for s in slices}
    assert len(pools) == 1, pools
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}, slices
    assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1, slices
    (counter_slice,) = [s["spec"] for s in slices if s["spec"].get("sharedCounters")]
    (device_slice,) = [s["spec"] for s in slices if s["spec"].get("devices")]
    assert not counter_slice.get("devices")
    assert not device_slice.get("sharedCounters")
    assert counter_slice["sharedCounters"] == [
        {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}}
    ]
    devices = {d["name"]: d for d in device_slice["devices"]}
    assert sorted(devices) == sorted([*PARTITIONS, "gpu-0-full"])
    part = {"memory": {"value": "20Gi"}, "compute": {"value": "25"}}
    whole = {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}
    for name, device in devices.items():
        wanted = whole if name == "gpu-0-full" else part
        assert device["consumesCounters"] == [{"counterSet": "gpu-0-counters", "counters": wanted}], device
        assert device["capacity"] == wanted, device
        attributes = device["attributes"]
        assert attributes["partitionable"] == {"bool": True}, device
        if name == "gpu-0-full":
            assert attributes["full"] == {"bool": True}, device
            assert "partition" not in attributes, device
        else:
            assert attributes["partition"] == {"int": int(name.rpartition("-")[2])}, device
    kit.notes.append(
        f"dra-partitions pool {pools.pop()}: generation {slices[0]['spec']['pool']['generation']}, "
        f"slices {sorted(s['metadata']['name'] for s in slices)}"
    )


def test_partitions_and_the_full_gpu_never_exceed_the_counters(kit: Kit, host: DraHost) -> None:
    # (b) the reference scenario: one pod, one container, two partitions of the same GPU
    kit.apply_all(docs(NAMESPACE, "two-partitions", "full-gpu"))
    started = time.monotonic()
    kit.apply_all(docs("pod0"))
    wait_running(kit, "pod0", "pod0 (2 partitions): applied -> running", started)
    first = partitions(gpu_env(kit, "pod0"))
    assert len(first) == 2, first
    assert first == allocated(kit, "pod0")

    # (c) the full GPU needs every counter: it cannot be placed while two partitions are held
    started = time.monotonic()
    kit.apply_all(docs("pod-full"))
    message = first_event(kit, NAMESPACE, "pod-full", "FailedScheduling")
    kit.timings["dra-partitions pod-full: applied -> FailedScheduling"] = since(started)
    kit.notes.append(f"dra-partitions pod-full FailedScheduling (2 partitions held): {message}")
    record_refusal(kit, NAMESPACE, "pod-full", message)
    print(f"pod-full FailedScheduling: {message}")

    # two more partitions still fit: 4 x 20Gi = the GPU's 80Gi
    started = time.monotonic()
    kit.apply_all(docs("pod1"))
    wait_running(kit, "pod1", "pod1 (2 more partitions): applied -> running", started)
    second = partitions(gpu_env(kit, "pod1"))
    assert len(second) == 2, second
    assert not set(first) & set(second), (first, second)
    assert sorted(first + second) == PARTITIONS
    record(kit, NAMESPACE, observed(kit, NAMESPACE, ["pod0", "pod1"], DRIVER))
    still = kit.get("pod", "-n", NAMESPACE, "pod-full")
    assert still["status"].get("phase") == "Pending", still["status"]
    assert not still["spec"].get("nodeName"), still["spec"]

    # every partition released: the full GPU is placed and runs
    started = time.monotonic()
    delete_pods(kit, "pod0", "pod1")
    wait_running(kit, "pod-full", "pod-full: partition pods deleted -> running", started, within=240)
    env = gpu_env(kit, "pod-full")
    assert env.get("GPU_DEVICE_0_FULL") == "gpu-0-full", env
    assert not [k for k in env if PARTITION_KEY.match(k)], env
    assert allocated(kit, "pod-full") == ["gpu-0-full"]
