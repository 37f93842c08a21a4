"""The e2e suite's scenarios on the stand-in API server: the allocation the real cluster made.

Each scenario of tests/e2e (the reference driver's, the partition, share and taint ones) runs
here as the scheduler would run it: the slices are the ones the host publishes for the port
(devicehost-dra-example, with the e2e suite's settings), the DeviceClass is its deploy
manifest's, the claims are the scenario's manifest's, allocated pod by pod in the order the
e2e suite applies them. What each pod gets is what the cluster gave it, as the closing notes of
the e2e runs recorded; where ``DEVICEHOST_E2E_ALLOCATIONS`` names the record of an e2e run
(:mod:`allocations`), the stand-in's allocation is also compared with that run's.
"""

from __future__ import annotations

import asyncio
import copy
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from allocations import RECORD, Manifest, Pods, record, record_refusal, recorded, release, scheduled

from devicehost.standin.allocator import CANNOT_ALLOCATE
from devicehost.standin.apiserver import ApiServerStandIn, Unschedulable
from devicehost.testing.cluster import registered_endpoint
from devicehost.testing.host import running_host
from devicehost_dra_example import DraExampleBackend
from devicehost_dra_example.net import DraExampleNetBackend

DEPLOY = Path(__file__).resolve().parents[1] / "plugins" / "devicehost-dra-example" / "deploy"
NODE = "node-a"
_published: dict[str, dict[str, dict[str, Any]]] = {}


async def published(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The slices the host publishes for the port with ``settings`` (once per settings)."""
    key = repr(sorted((k, sorted(v.items())) for k, v in settings.items()))
    if key not in _published:
        backends = {"dra-example": DraExampleBackend(), "dra-example-net": DraExampleNetBackend()}
        cluster = ApiServerStandIn()
        with tempfile.TemporaryDirectory(prefix="scn-", dir="/tmp") as tmp:
            root = Path(tmp)
            (root / "dp").mkdir()
            (root / "registry").mkdir()
            async with running_host(
                root / "dp",
                {name: backends[name] for name in settings},
                cluster=cluster,
                node_name=NODE,
                backends={name: {"node_name": NODE, **values} for name, values in settings.items()},
                dra_plugins_dir=root / "plugins",
                plugins_registry_dir=root / "registry",
                cdi_dir=root / "cdi",
                device_release=False,
            ):
                await registered(root / "registry", len(settings))
                wanted = sum(2 if v.get("gpu_partitions") else 1 for v in settings.values())
                await cluster.wait(lambda c: len(c.stored) == wanted)
                _published[key] = copy.deepcopy(cluster.stored)  # the host deletes them as it stops
    return _published[key]


async def registered(registry: Path, drivers: int) -> None:
    """Register every driver's socket with the kubelet, as the kubelet's plugin watcher does."""
    async with asyncio.timeout(10):
        while len(sockets := sorted(registry.glob("*.sock"))) < drivers:
            await asyncio.sleep(0.05)
    for socket in sockets:
        await registered_endpoint(socket)


async def stand_in(**settings: Mapping[str, Any]) -> ApiServerStandIn:
    """A stand-in API server holding the port's slices for ``settings`` and its DeviceClasses."""
    cluster = ApiServerStandIn()
    cluster.stored.update(await published(settings))
    for path in DEPLOY.glob("*deviceclass.yaml"):
        body = yaml.safe_load(path.read_text())
        cluster.classes[body["metadata"]["name"]] = body
    return cluster


def compare(scenario: str, got: Pods, expected: Pods) -> None:
    """``got`` is what the cluster gave: as the notes say, and as each recorded e2e run did."""
    assert got == expected, scenario
    for run in recorded(scenario):
        assert {pod: got[pod] for pod in run} == run, f"{scenario}: the cluster allocated {run}"


def run(cluster: ApiServerStandIn, scenario: str, pods: list[str]) -> Pods:
    manifest = Manifest(scenario)
    return {pod: scheduled(cluster, manifest, pod) for pod in pods}


def refused(cluster: ApiServerStandIn, manifest: Manifest, pod: str, scenario: str = "") -> str:
    """The stand-in's refusal of the pod's claims; the cluster's FailedScheduling message for it,
    where an e2e run recorded one, begins with it."""
    with pytest.raises(Unschedulable) as refusal:
        scheduled(cluster, manifest, pod)
    for run in recorded(scenario or manifest.name, "refused"):
        if pod in run:
            assert run[pod].startswith(str(refusal.value)), f"the cluster said {run[pod]!r}"
    return str(refusal.value)


EIGHT = {"dra-example": {"num_gpus": 8}}

REFERENCE = [
    ("gpu-one-per-pod", {"pod0": {"gpu": [["gpu", "gpu-0"]]}, "pod1": {"gpu": [["gpu", "gpu-1"]]}}),
    ("gpu-two-in-one-container", {"pod0": {"gpus": [["gpu0", "gpu-0"], ["gpu1", "gpu-1"]]}}),
    ("gpu-shared-across-containers", {"pod0": {"shared-gpu": [["gpu", "gpu-0"]]}}),
    ("gpu-shared-across-pods", {"pod0": {"gpu": [["gpu", "gpu-0"]]}, "pod1": {"gpu": [["gpu", "gpu-0"]]}}),
    ("gpu-shared-with-init-container", {"pod0": {"gpu": [["gpu", "gpu-0"]]}}),
    ("gpu-sharing-from-claim-config", {"pod0": {"gpus": [["ts-gpu", "gpu-0"], ["sp-gpu", "gpu-1"]]}}),
    ("gpu-admin-access", {"pod0": {"admin-gpus": [["admin-gpu", f"gpu-{i}"] for i in range(8)]}}),
    ("gpu-cel-selector", {"pod0": {"gpu": [["gpu", "gpu-1"]]}}),
    (
        "gpu-first-available",
        {"pod0": {"gpu": [["gpu/any-gpu", "gpu-0"]]}, "pod1": {"gpu": [["gpu/latest-model", "gpu-1"]]}},
    ),
]


@pytest.mark.parametrize(("scenario", "expected"), REFERENCE, ids=[s for s, _ in REFERENCE])
async def test_the_reference_scenarios_allocate_as_on_the_cluster(scenario: str, expected: Pods) -> None:
    cluster = await stand_in(**EIGHT)
    got = run(cluster, scenario, list(expected))
    compare(scenario, got, expected)
    if scenario == "gpu-admin-access":
        (claim,) = cluster.claims.values()
        assert all(d.admin_access for d in claim.devices)
    if scenario == "gpu-sharing-from-claim-config":
        (claim,) = cluster.claims.values()
        intervals = [(c.requests, c.parameters["sharing"]["strategy"]) for c in claim.configs]
        assert intervals == [(("ts-gpu",), "TimeSlicing"), (("sp-gpu",), "SpacePartitioning")]


async def test_partitions_and_the_full_gpu_never_exceed_the_counters() -> None:
    cluster = await stand_in(**{"dra-example": {"num_gpus": 1, "gpu_partitions": 4}})
    manifest = Manifest("gpu-partitions")
    first = scheduled(cluster, manifest, "pod0")
    assert first == {
        "gpu-partitions": [["gpu-partition", "gpu-0-partition-0"], ["gpu-partition", "gpu-0-partition-1"]]
    }
    assert refused(cluster, manifest, "pod-full") == CANNOT_ALLOCATE
    second = scheduled(cluster, manifest, "pod1")
    assert second == {
        "gpu-partitions": [["gpu-partition", "gpu-0-partition-2"], ["gpu-partition", "gpu-0-partition-3"]]
    }
    compare("gpu-partitions", {"pod0": first, "pod1": second}, {"pod0": first, "pod1": second})
    release(cluster, manifest, "pod0")
    assert refused(cluster, manifest, "pod-full") == CANNOT_ALLOCATE  # two partitions still held
    release(cluster, manifest, "pod1")
    assert scheduled(cluster, manifest, "pod-full") == {"gpu": [["gpu", "gpu-0-full"]]}
    for pod in ("pod0", "pod1"):
        assert refused(cluster, manifest, pod) == CANNOT_ALLOCATE  # the full GPU holds every counter


SHARES = {
    "dra-example": {"num_gpus": 1, "gpu_allow_multiple_allocations": True},
    "dra-example-net": {"num_nics": 1},
}


async def test_two_claims_share_one_gpu_and_a_third_beyond_its_memory_waits() -> None:
    cluster = await stand_in(**SHARES)
    got = run(cluster, "dra-shares", ["gpu-pod0", "gpu-pod1"])
    compare("dra-shares gpu", got, {p: {"dev": [["dev", "gpu-0"]]} for p in ("gpu-pod0", "gpu-pod1")})
    shares = [cluster.claims[("dra-shares", f"shared-gpu-pod{i}")].devices[0] for i in range(2)]
    assert [dict(s.consumed) for s in shares] == [{"memory": "16Gi", "compute": "20"}] * 2
    assert shares[0].share_id != shares[1].share_id
    # as the e2e test makes it: gpu-pod0's claim for 60Gi instead of 16Gi, for too-big-pod
    manifest = Manifest("dra-shares")
    too_big = copy.deepcopy(manifest.of("ResourceClaim")["shared-gpu-pod0"])
    too_big["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "60Gi"
    manifest.docs.append({**too_big, "metadata": {"name": "too-big"}})
    pod = copy.deepcopy(manifest.of("Pod")["gpu-pod0"])
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = "too-big"
    manifest.docs.append({**pod, "metadata": {"name": "too-big-pod"}})
    assert refused(cluster, manifest, "too-big-pod", "dra-shares gpu") == CANNOT_ALLOCATE


async def test_two_claims_share_one_nic_each_with_its_bandwidth() -> None:
    cluster = await stand_in(**SHARES)
    got = run(cluster, "dra-shares", ["nic-pod0", "nic-pod1"])
    compare("dra-shares nic", got, {p: {"dev": [["dev", "nic-0"]]} for p in ("nic-pod0", "nic-pod1")})
    consumed = [dict(d.consumed) for c in cluster.claims.values() for d in c.devices]
    assert [{k: v for k, v in c.items() if k != "vfs"} for c in consumed] == [
        {"ingressBandwidth": "10G", "egressBandwidth": "5G"},
        {"ingressBandwidth": "5G", "egressBandwidth": "5G"},
    ]


async def test_two_claims_share_one_partition() -> None:
    cluster = await stand_in(**{"dra-example": {**SHARES["dra-example"], "gpu_partitions": 2}})
    got = run(cluster, "dra-shares", ["partition-pod0", "partition-pod1"])
    expected = {p: {"dev": [["dev", "gpu-0-partition-0"]]} for p in ("partition-pod0", "partition-pod1")}
    compare("dra-shares partition", got, expected)
    consumed = [dict(d.consumed) for c in cluster.claims.values() for d in c.devices]
    assert consumed == [{"memory": "8Gi", "compute": "10"}] * 2


THREE = {"dra-example": {"num_gpus": 3}}


def rule(cluster: ApiServerStandIn, manifest: Manifest) -> dict[str, Any]:
    """The scenario's DeviceTaintRule, naming the published pool where it names one (as the e2e
    test fills it in)."""
    (body,) = manifest.of("DeviceTaintRule").values()
    selector = body["spec"]["deviceSelector"]
    if "pool" in selector:
        (selector["pool"],) = {s["spec"]["pool"]["name"] for s in cluster.stored.values()}
    return body


async def test_a_noschedule_rule_keeps_new_claims_off_and_leaves_the_held_alone() -> None:
    cluster, manifest = await stand_in(**THREE), Manifest("gpu-taint-noschedule")
    assert scheduled(cluster, manifest, "pod-keeps-running") == {"gpu": [["gpu", "gpu-0"]]}
    cluster.taint_rules["gpu-taint-noschedule"] = rule(cluster, manifest)
    assert refused(cluster, manifest, "pod-no-schedule") == CANNOT_ALLOCATE
    assert [d.device for d in cluster.claims[(manifest.namespace, "pod-keeps-running-gpu")].devices] == [
        "gpu-0"
    ]
    cluster.taint_rules.clear()
    got = {pod: scheduled(cluster, manifest, pod) for pod in ("pod-keeps-running", "pod-no-schedule")}
    compare(
        manifest.name,
        got,
        {"pod-keeps-running": {"gpu": [["gpu", "gpu-0"]]}, "pod-no-schedule": {"gpu": [["gpu", "gpu-1"]]}},
    )


async def test_a_rule_naming_one_device_taints_only_that_device() -> None:
    cluster, manifest = await stand_in(**THREE), Manifest("gpu-taint-one-device")
    cluster.taint_rules["one"] = rule(cluster, manifest)
    assert refused(cluster, manifest, "pod-gpu-2") == CANNOT_ALLOCATE
    assert scheduled(cluster, manifest, "pod-any-gpu") == {"gpu": [["gpu", "gpu-0"]]}
    cluster.taint_rules.clear()
    got = {pod: scheduled(cluster, manifest, pod) for pod in ("pod-any-gpu", "pod-gpu-2")}
    compare(
        manifest.name,
        got,
        {"pod-any-gpu": {"gpu": [["gpu", "gpu-0"]]}, "pod-gpu-2": {"gpu": [["gpu", "gpu-2"]]}},
    )


@pytest.mark.parametrize("scenario", ["gpu-taint-toleration", "gpu-taint-noexecute"])
async def test_only_a_tolerating_claim_is_given_a_gpu_under_a_noexecute_rule(scenario: str) -> None:
    cluster, manifest = await stand_in(**THREE), Manifest(scenario)
    cluster.taint_rules[scenario] = rule(cluster, manifest)
    tolerating, intolerant = (
        ("pod-with-toleration", "pod-without-toleration")
        if scenario == "gpu-taint-toleration"
        else ("pod-tolerating", "pod-no-execute")
    )
    assert scheduled(cluster, manifest, tolerating) == {"gpu": [["gpu", "gpu-0"]]}
    assert refused(cluster, manifest, intolerant) == CANNOT_ALLOCATE


async def test_three_pods_get_the_three_gpus_before_the_eviction_rule() -> None:
    cluster = await stand_in(**THREE)
    pods = ["pod-no-toleration", "pod-with-toleration", "pod-with-20s-toleration"]
    got = run(cluster, "gpu-taint-eviction-time", pods)
    compare("gpu-taint-eviction-time", got, {p: {"gpu": [["gpu", f"gpu-{i}"]]} for i, p in enumerate(pods)})


def gizmo_slice(tainted: bool) -> dict[str, Any]:
    """The gizmo host's slice as the cluster showed it: gizmo-1 with the host's unhealthy taint."""
    taint = {
        "key": "devicehost.io/unhealthy",
        "value": "true",
        "effect": "NoSchedule",
        "timeAdded": "2026-01-01T00:00:00Z",
    }
    devices = [
        {
            "name": f"gizmo-{i}",
            "attributes": {"id": {"string": f"gizmo-{i}"}},
            **({"taints": [taint]} if tainted and i else {}),
        }
        for i in range(2)
    ]
    spec = {
        "driver": "gizmos.example.org",
        "nodeName": NODE,
        "pool": {"name": f"{NODE}/gizmo", "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    return {"metadata": {"name": "gizmos"}, "spec": spec}


async def test_an_unhealthy_gizmo_goes_only_to_a_claim_tolerating_its_taint() -> None:
    cluster, manifest = ApiServerStandIn(), Manifest("gizmo-unhealthy")
    cluster.classes["gizmo.gizmos.example.org"] = {
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gizmos.example.org"'}}]}
    }
    cluster.stored["gizmos"] = gizmo_slice(tainted=True)
    assert refused(cluster, manifest, "pod-intolerant") == CANNOT_ALLOCATE
    assert scheduled(cluster, manifest, "pod-tolerating") == {"gizmo": [["gizmo", "gizmo-1"]]}
    cluster.claims.clear()
    cluster.stored["gizmos"] = gizmo_slice(tainted=False)
    assert scheduled(cluster, manifest, "pod-intolerant") == {"gizmo": [["gizmo", "gizmo-1"]]}


def test_a_recorded_run_of_the_cluster_is_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit = SimpleNamespace(notes=[])
    monkeypatch.setenv(RECORD, str(tmp_path / "allocations.jsonl"))
    record(kit, "gpu-one-per-pod", {"pod0": {"gpu": [["gpu", "gpu-1"]]}})
    assert kit.notes == ['allocation gpu-one-per-pod: {"pod0": {"gpu": [["gpu", "gpu-1"]]}}']
    got = {"pod0": {"gpu": [["gpu", "gpu-0"]]}, "pod1": {"gpu": [["gpu", "gpu-1"]]}}
    compare("gpu-cel-selector", got, got)  # nothing recorded of it
    with pytest.raises(
        AssertionError, match=r"the cluster allocated \{'pod0': \{'gpu': \[\['gpu', 'gpu-1'\]\]\}\}"
    ):
        compare("gpu-one-per-pod", got, got)


def test_a_recorded_refusal_of_the_cluster_is_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = SimpleNamespace(notes=[])
    cluster, manifest = ApiServerStandIn(), Manifest("gpu-one-per-pod")
    cluster.classes["gpu.example.com"] = yaml.safe_load((DEPLOY / "deviceclass.yaml").read_text())
    monkeypatch.setenv(RECORD, str(tmp_path / "taints.jsonl"))
    record_refusal(kit, manifest.name, "pod0", "0/1 nodes are available: 1 node(s) had untolerated taint.")
    with pytest.raises(AssertionError, match="the cluster said '0/1 nodes are available: 1 node"):
        refused(cluster, manifest, "pod0")
    monkeypatch.setenv(RECORD, str(tmp_path / "claims.jsonl"))
    said = (
        f"{CANNOT_ALLOCATE} preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    )
    record_refusal(kit, manifest.name, "pod0", said)
    assert refused(cluster, manifest, "pod0") == CANNOT_ALLOCATE
    assert kit.notes[-1] == f"refusal gpu-one-per-pod pod0: {said}"
