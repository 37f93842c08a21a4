"""The Go reference DRA driver's scenarios, run against its port (devicehost-dra-example).

kubernetes-sigs/dra-example-driver proves its GPU profile with one scenario per DRA feature
(``demo/examples``) and an e2e suite that reads what each container was given from its log. Here
the same scenarios run on the kit's cluster against ``devicehost run --backend dra-example`` as a
process on the node, started as an operator would start it, with containerd 1.7 putting the
claim's CDI edits into each container. Each scenario has its own namespace and manifest
(``manifests/``), is timed from apply to every pod Running (``kit.timings``), shows the
``GPU_DEVICE_*`` and ``DRA_*`` lines each container printed (``kit.notes``, in the session's
report) and deletes its namespace, so that every GPU is free for the next.

The extended-resource scenario needs the alpha gate DRAExtendedResource: it runs last, with the
gate turned on for it and off again after it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from allocations import observed, record
from drahost import DraHost, container_env, device_count, event_messages, since, wait_running
from k8skit import ClusterDra, Kit, dra_gates, until

REPO = Path(__file__).resolve().parents[2]
GATE = "DRAExtendedResource"
"""Off by default in 1.34 and 1.35: turned on for the extended-resource scenario there."""
MANIFESTS = Path(__file__).resolve().parent / "manifests"
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
DRIVER = "gpu.example.com"
GPUS = 8
LABEL = "devicehost-e2e=dra-example"
GPU_KEY = re.compile(r"^GPU_DEVICE_(\d+)$")


def published(kit: Kit) -> bool:
    return device_count(kit, DRIVER) == GPUS


def delete_scenarios(kit: Kit) -> None:
    """Every scenario namespace (pods first: the kubelet unprepares their claims through the host)."""
    kit.kubectl("delete", "pods", "-A", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)
    kit.kubectl("delete", "namespaces", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture(scope="module")
def host(kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    node = kit.node()["metadata"]["name"]
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    started = time.monotonic()
    gpu_host = DraHost.backend("dra-example", node, tmp_path_factory.mktemp("dra-example") / "host.log")
    gpu_host.start()
    try:
        gpu_host.ready(lambda: published(kit), f"a ResourceSlice of {DRIVER} with {GPUS} GPUs")
        kit.timings["dra-example: host start -> 8 GPUs published"] = since(started)
        delete_scenarios(kit)  # left by a killed run
        yield gpu_host
    finally:
        if gpu_host.running():
            delete_scenarios(kit)
        gpu_host.stop()
        kit.kubectl("delete", "deviceclass", DRIVER, "gpu-extended.example.com", "--ignore-not-found")
        gpu_host.finish(kit, "dra-example")


@contextmanager
def scenario(kit: Kit, name: str) -> Iterator[list[dict[str, Any]]]:
    """The manifest ``manifests/<name>.yaml`` (its documents, in order); its namespace deleted
    after the scenario whatever happened."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text()) if d]
    try:
        yield docs
    finally:
        kit.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=180)


def run_scenario(kit: Kit, name: str, docs: Sequence[dict[str, Any]], pods: Sequence[str]) -> None:
    """Apply ``docs`` and wait until ``pods`` run; the time it took goes to kit.timings."""
    started = time.monotonic()
    kit.apply_all(docs)
    wait_running(kit, name, pods)
    kit.timings[f"dra-example {name}: applied -> running"] = since(started)
    record(kit, name, observed(kit, name, list(pods), DRIVER))


def gpu_env(kit: Kit, namespace: str, pod: str, container: str) -> dict[str, str]:
    """The environment the container printed (envsleep's ``ENV KEY=VALUE`` lines); its GPU and DRA
    lines are shown in the session's report."""
    return container_env(kit, "dra-example", namespace, pod, container, DRIVER)


def gpus(env: dict[str, str]) -> list[str]:
    """The GPUs a container was given (``GPU_DEVICE_<n>=gpu-<n>``), as the reference reads them."""
    found = []
    for key, value in env.items():
        match = GPU_KEY.match(key)
        if match:
            assert value == f"gpu-{match[1]}", f"{key}={value}"
            found.append(value)
    return sorted(found)


def gpu_property(env: dict[str, str], gpu: str, prop: str) -> str | None:
    return env.get(f"GPU_DEVICE_{gpu.removeprefix('gpu-')}_{prop}")


def claim_uid(kit: Kit, namespace: str, pod: str, claim: str) -> str:
    """The uid of the ResourceClaim the pod's ``claim`` entry stands for."""
    found = kit.get("pod", "-n", namespace, pod)
    (entry,) = [c for c in found["spec"]["resourceClaims"] if c["name"] == claim]
    if "resourceClaimName" in entry:
        name = entry["resourceClaimName"]
    else:  # made from a template: the pod's status names it
        statuses = found["status"].get("resourceClaimStatuses", [])
        (name,) = [s["resourceClaimName"] for s in statuses if s["name"] == claim]
    uid: str = kit.get("resourceclaim", "-n", namespace, name)["metadata"]["uid"]
    return uid


def assert_shared(
    kit: Kit, namespace: str, members: Sequence[tuple[str, str]], strategy: str, prop: str, value: str
) -> tuple[str, list[dict[str, str]]]:
    """verifySharedGPUGroup: each member sees exactly one GPU, the same one, shared as said;
    that GPU and each member's environment."""
    seen, envs = set(), []
    for pod, container in members:
        env = gpu_env(kit, namespace, pod, container)
        (gpu,) = gpus(env)
        seen.add(gpu)
        envs.append(env)
        assert gpu_property(env, gpu, "SHARING_STRATEGY") == strategy, (pod, container, env)
        assert gpu_property(env, gpu, prop) == value, (pod, container, env)
    assert len(seen) == 1, f"{namespace}: {members} should share one GPU, saw {sorted(seen)}"
    return seen.pop(), envs


def test_one_distinct_gpu_per_pod(kit: Kit, host: DraHost) -> None:
    name = "gpu-one-per-pod"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0", "pod1"])
        observed: dict[str, str] = {}
        for pod in ("pod0", "pod1"):
            env = gpu_env(kit, name, pod, "ctr0")
            (gpu,) = gpus(env)
            assert gpu not in observed, f"{pod} got {gpu}, already {observed[gpu]}'s"
            observed[gpu] = pod
            assert gpu_property(env, gpu, "RESOURCE_CLAIM") == claim_uid(kit, name, pod, "gpu")
            assert gpu_property(env, gpu, "SHARING_STRATEGY") == "TimeSlicing"
            assert gpu_property(env, gpu, "TIMESLICE_INTERVAL") == "Default"
            assert env["DRA_ADMIN_ACCESS"] == "false"


def test_two_gpus_in_one_container(kit: Kit, host: DraHost) -> None:
    name = "gpu-two-in-one-container"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        env = gpu_env(kit, name, "pod0", "ctr0")
        found = gpus(env)
        assert len(found) == 2, found  # distinct: one GPU_DEVICE_<n> key each
        uid = claim_uid(kit, name, "pod0", "gpus")
        assert all(gpu_property(env, gpu, "RESOURCE_CLAIM") == uid for gpu in found), env


def test_one_gpu_shared_across_containers(kit: Kit, host: DraHost) -> None:
    name = "gpu-shared-across-containers"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        members = [("pod0", "ctr0"), ("pod0", "ctr1")]
        assert_shared(kit, name, members, "TimeSlicing", "TIMESLICE_INTERVAL", "Default")


def test_one_gpu_shared_across_pods(kit: Kit, host: DraHost) -> None:
    name = "gpu-shared-across-pods"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0", "pod1"])
        members = [("pod0", "ctr0"), ("pod1", "ctr0")]
        gpu, envs = assert_shared(kit, name, members, "TimeSlicing", "TIMESLICE_INTERVAL", "Default")
        uid = claim_uid(kit, name, "pod0", "gpu")
        assert [gpu_property(env, gpu, "RESOURCE_CLAIM") for env in envs] == [uid, uid]


def test_one_gpu_shared_with_an_init_container(kit: Kit, host: DraHost) -> None:
    name = "gpu-shared-with-init-container"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        members = [("pod0", "init0"), ("pod0", "ctr0")]
        assert_shared(kit, name, members, "TimeSlicing", "TIMESLICE_INTERVAL", "Default")


def test_time_slicing_and_space_partitioning_from_claim_config(kit: Kit, host: DraHost) -> None:
    name = "gpu-sharing-from-claim-config"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        ts = [("pod0", "ts-ctr0"), ("pod0", "ts-ctr1")]
        sp = [("pod0", "sp-ctr0"), ("pod0", "sp-ctr1")]
        ts_gpu, _ = assert_shared(kit, name, ts, "TimeSlicing", "TIMESLICE_INTERVAL", "Long")
        sp_gpu, _ = assert_shared(kit, name, sp, "SpacePartitioning", "PARTITION_COUNT", "10")
        assert ts_gpu != sp_gpu


def test_admin_access(kit: Kit, host: DraHost) -> None:
    name = "gpu-admin-access"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        env = gpu_env(kit, name, "pod0", "ctr0")
        assert env["DRA_ADMIN_ACCESS"] == "true"
        assert gpus(env) == sorted(f"gpu-{i}" for i in range(GPUS))  # allocationMode: All


def test_selection_by_cel(kit: Kit, host: DraHost) -> None:
    name = "gpu-cel-selector"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0"])
        env = gpu_env(kit, name, "pod0", "ctr0")
        assert gpus(env) == ["gpu-1"]  # the one whose index attribute is 1


def test_first_available_prefers_the_first_subrequest_and_falls_back(kit: Kit, host: DraHost) -> None:
    name = "gpu-first-available"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0", "pod1"])
        observed: dict[str, str] = {}
        for pod, chosen in (("pod0", "gpu/any-gpu"), ("pod1", "gpu/latest-model")):
            env = gpu_env(kit, name, pod, "ctr0")
            (gpu,) = gpus(env)
            assert gpu not in observed, f"{pod} got {gpu}, already {observed[gpu]}'s"
            observed[gpu] = pod
            uid = claim_uid(kit, name, pod, "gpu")
            (found,) = [
                c for c in kit.get("resourceclaims", "-n", name)["items"] if c["metadata"]["uid"] == uid
            ]
            results = [
                r for r in found["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER
            ]
            assert [r["request"] for r in results] == [chosen], results
            assert results[0]["device"] == gpu
            kit.notes.append(f"dra-example {name} {pod}: allocated by request {results[0]['request']}")


def test_an_invalid_claim_config_is_refused_naming_the_key(kit: Kit, host: DraHost) -> None:
    name = "gpu-invalid-config"
    with scenario(kit, name) as docs:
        invalid = [d for d in docs if d["metadata"]["name"] not in {"medium", "valid-pod"}]
        valid = [d for d in docs if d["metadata"]["name"] in {"medium", "valid-pod"}]
        started = time.monotonic()
        kit.apply_all(invalid)

        def refused() -> list[str]:
            found = event_messages(kit, name, "invalid-pod", "FailedPrepareDynamicResources")
            return [m for m in found if "sharing.timeSlicingConfig.interval" in m]

        (message, *_) = until(refused, "FailedPrepareDynamicResources naming the key", within=90)
        kit.timings[f"dra-example {name}: applied -> FailedPrepareDynamicResources"] = round(
            time.monotonic() - started, 2
        )
        kit.notes.append(f"dra-example {name} invalid-pod event: {message}")
        print(f"{name} invalid-pod FailedPrepareDynamicResources: {message}")
        run_scenario(kit, name, valid, ["valid-pod"])
        env = gpu_env(kit, name, "valid-pod", "ctr0")
        (gpu,) = gpus(env)
        assert gpu_property(env, gpu, "TIMESLICE_INTERVAL") == "Medium"
        pod = kit.get("pod", "-n", name, "invalid-pod")["status"]
        assert pod["phase"] == "Pending", pod
        (waiting,) = [
            s["state"].get("waiting", {}).get("reason") for s in pod.get("containerStatuses", [])
        ] or ["ContainerCreating"]
        assert waiting == "ContainerCreating", pod


@pytest.fixture(scope="module")
def extended_resources(kit: Kit, host: DraHost, dra_cluster: ClusterDra) -> Iterator[Kit]:
    """DRAExtendedResource on for the rest of the module where the cluster's version keeps it off
    (1.34, 1.35); the kit's gates (none) again after."""
    restart = bool(dra_cluster.gates(GATE))
    registered = len(host.events("registered with the kubelet"))
    try:
        with dra_gates(kit, dra_cluster, "dra-example", [GATE]):
            if restart:
                until(
                    lambda: len(host.events("registered with the kubelet")) > registered,
                    "registered again",
                    60,
                )
                until(lambda: published(kit), "the GPUs published again", within=60)
            try:
                yield kit
            finally:
                kit.kubectl(
                    "delete",
                    "namespace",
                    "gpu-extended-resource",
                    "--ignore-not-found",
                    "--wait=true",
                    timeout=180,
                )
                kit.kubectl("delete", "deviceclass", "gpu-extended.example.com", "--ignore-not-found")
                registered = len(host.events("registered with the kubelet"))
    finally:
        if restart:
            until(
                lambda: len(host.events("registered with the kubelet")) > registered, "registered again", 60
            )


def test_extended_resource_requests_get_gpus_through_dra(extended_resources: Kit, host: DraHost) -> None:
    kit, name = extended_resources, "gpu-extended-resource"
    with scenario(kit, name) as docs:
        run_scenario(kit, name, docs, ["pod0", "pod1"])
        observed: dict[str, str] = {}
        wanted = {"pod0": f"deviceclass.resource.kubernetes.io/{DRIVER}", "pod1": "example.com/gpu"}
        for pod, resource in wanted.items():
            env = gpu_env(kit, name, pod, "ctr0")
            (gpu,) = gpus(env)
            assert gpu not in observed, f"{pod} got {gpu}, already {observed[gpu]}'s"
            observed[gpu] = pod
            status = kit.get("pod", "-n", name, pod)["status"]["extendedResourceClaimStatus"]
            mappings = [m for m in status["requestMappings"] if m["containerName"] == "ctr0"]
            assert [m["resourceName"] for m in mappings] == [resource], status
            assert mappings[0]["requestName"], status
            uid = kit.get("resourceclaim", "-n", name, status["resourceClaimName"])["metadata"]["uid"]
            assert gpu_property(env, gpu, "RESOURCE_CLAIM") == uid
            kit.notes.append(f"dra-example {name} {pod}: {resource} -> claim {status['resourceClaimName']}")
