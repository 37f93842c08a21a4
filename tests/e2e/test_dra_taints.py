"""Device taints (issue 25 item 4) on the real cluster: the reference's device-taint scenarios.

kubernetes-sigs/dra-example-driver shows device taints with four scenarios
(``demo/examples/device-taints-tolerations``): a DeviceTaintRule with effect NoSchedule leaves a
running pod alone and keeps new pods off the tainted GPUs; NoExecute evicts the pods whose claims
do not tolerate the taint; a claim's toleration (on its device request) lets its pod use a tainted
GPU; ``tolerationSeconds`` delays the eviction. Here they run against the port
(``devicehost run --backend dra-example`` with 3 GPUs) as a process on the node; the manifests
are ``manifests/gpu-taint-*.yaml``, one namespace each, every rule tainting all the driver's GPUs
as the reference's do, but for ``gpu-taint-one-device``, whose rule names one GPU by driver, pool
and device.

The API needs what the cluster's version keeps off (``ClusterDra``, from the stand-ins' version
table): on 1.35 the alpha gates DRADeviceTaints (taints and tolerations) and DRADeviceTaintRules
(the DeviceTaintRule API and its eviction controller), on the API server, controller-manager,
scheduler and kubelet, and ``--runtime-config=resource.k8s.io/v1alpha3=true`` on the API server;
on 1.36 DRADeviceTaintRules and ``resource.k8s.io/v1beta2`` (DRADeviceTaints is on, and with the
gate on but v1beta2 not served the 1.36 scheduler schedules no DRA pod at all); on 1.37 nothing
(``resource.k8s.io/v1``). The manifests' rules are written in that version. What is set is set
for this module and taken away after it. DRADeviceTaints alone is not enough on 1.35: the API
server serves and accepts the rules, but the NoSchedule rule kept no pod off its GPUs (no
FailedScheduling within 90 s; tried on v1.35.6). Times go to
``kit.timings``, what the containers printed, the scheduler's and the eviction controller's
messages to ``kit.notes``.

Last, the host's own taint (issue 25 item 4, host side): a second host serves the gizmo fixture
backend through DRA (driver gizmos.example.org); a gizmo its backend reports unhealthy stays in
the slice with ``devicehost.io/unhealthy=true:NoSchedule``, a pod whose claim does not tolerate
it stays Pending, the taint goes when the gizmo recovers and the pod then runs on it. A pod whose
claim tolerates the taint is allocated the tainted gizmo by the scheduler, but the host refuses to
prepare an unhealthy device: that test is an expected failure (strict) until the host prepares it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from allocations import observed, record, record_refusal
from drahost import (
    DraHost,
    container_env,
    device_count,
    dra_config,
    driver_slices,
    event_messages,
    feature_gates,
    first_event,
    namespace_events,
    pods,
    printed_env,
    since,
    wait_running,
)
from k8skit import ClusterDra, Kit, until

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = Path(__file__).resolve().parent / "manifests"
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
DRIVER = "gpu.example.com"
GPUS = 3
SETTINGS = {"dra-example": {"num_gpus": GPUS}}
TAINT_GATES = ("DRADeviceTaints", "DRADeviceTaintRules")
LABEL = "devicehost-e2e=dra-taints"
GPU_KEY = re.compile(r"^GPU_DEVICE_(\d+)$")
EVICTION = "DeviceTaintManagerEviction"
TOLERATION_SECONDS = 20
GIZMO_DRIVER = "gizmos.example.org"
GIZMO_CLASS_NAME = "gizmo.gizmos.example.org"
GIZMO_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": GIZMO_CLASS_NAME, "labels": {"devicehost-e2e": "dra-taints"}},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GIZMO_DRIVER}"'}}]},
}
UNHEALTHY = "devicehost.io/unhealthy"


def published(kit: Kit) -> bool:
    return device_count(kit, DRIVER) == GPUS


def delete_rules(kit: Kit) -> None:
    kit.kubectl("delete", "devicetaintrules", "-l", LABEL, "--ignore-not-found", "--wait=true")


def delete_scenarios(kit: Kit) -> None:
    """Rules first (a NoExecute rule would evict the pods being deleted), then the pods (the
    kubelet unprepares their claims through the host), then the namespaces."""
    delete_rules(kit)
    kit.kubectl("delete", "pods", "-A", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)
    kit.kubectl("delete", "namespaces", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture(scope="module")
def gated(kit: Kit, dra_cluster: ClusterDra) -> Iterator[Kit]:
    """Device taints and DeviceTaintRules on for this module, with what the cluster's version
    needs for them (nothing on 1.37); the kit's gates and API versions (none) again after it."""
    gates = dra_cluster.gates(*TAINT_GATES)
    apis = dra_cluster.runtime_config(dra_cluster.taint_rule_api)
    if not gates and not apis:
        until(lambda: _serves_rules(kit), "the API server serving devicetaintrules", within=60)
        yield kit
        return
    what = f"dra-taints: {', '.join([*gates, *apis])} on (4 daemons restarted)"
    with feature_gates(kit, gates, what, apis or None):
        until(lambda: _serves_rules(kit), "the API server serving devicetaintrules", within=60)
        yield kit


def _serves_rules(kit: Kit) -> bool:
    try:
        out = kit.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name", timeout=30)
    except AssertionError:
        return False
    return "devicetaintrules.resource.k8s.io" in out.split()


@pytest.fixture(scope="module")
def host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    kit = gated
    node = kit.node()["metadata"]["name"]
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    delete_scenarios(kit)  # left by a killed run
    started = time.monotonic()
    log = tmp_path_factory.mktemp("dra-taints") / "host.log"
    gpu_host = DraHost.backend("dra-example", node, log, SETTINGS).start()
    try:
        gpu_host.ready(lambda: published(kit), f"a ResourceSlice of {DRIVER} with {GPUS} GPUs")
        kit.timings["dra-taints: host start -> 3 GPUs published"] = since(started)
        yield gpu_host
    finally:
        if gpu_host.running():
            delete_scenarios(kit)
        gpu_host.stop()
        kit.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found")
        gpu_host.finish(kit, "dra-taints")


@contextmanager
def scenario(kit: Kit, name: str) -> Iterator[dict[str, dict[str, Any]]]:
    """``manifests/<name>.yaml``'s documents by name; its rule and namespace deleted after the
    scenario whatever happened."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text()) if d]
    api = kit.dra().taint_rule_api
    for doc in docs:  # the manifests say v1alpha3: the version this cluster has them in
        if doc["kind"] == "DeviceTaintRule":
            doc["apiVersion"] = f"resource.k8s.io/{api}"
    try:
        by_kind = {"Namespace", "DeviceTaintRule"}  # one each: found by kind, the rest by name
        yield {d["kind"] if d["kind"] in by_kind else d["metadata"]["name"]: d for d in docs}
    finally:
        delete_rules(kit)
        kit.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=180)


def gone(kit: Kit, namespace: str, name: str) -> bool:
    """The pod is deleted or being deleted."""
    pod = pods(kit, namespace).get(name)
    return pod is None or "deletionTimestamp" in pod["metadata"]


def gpu_env(kit: Kit, namespace: str, pod: str) -> dict[str, str]:
    """What ctr0 printed (``ENV KEY=VALUE``); its GPU and DRA lines go to the report."""
    return container_env(kit, "dra-taints", namespace, pod, "ctr0", DRIVER)


def one_gpu(env: dict[str, str]) -> str:
    """The one GPU the container was given (``GPU_DEVICE_<n>=gpu-<n>``)."""
    found = [(match[1], value) for key, value in env.items() if (match := GPU_KEY.match(key))]
    assert len(found) == 1, env
    ((index, gpu),) = found
    assert gpu == f"gpu-{index}", env
    return gpu


def claim_of(kit: Kit, namespace: str, pod: str) -> str:
    (status,) = pods(kit, namespace)[pod]["status"]["resourceClaimStatuses"]
    name: str = status["resourceClaimName"]
    return name


def allocated(kit: Kit, namespace: str, claim: str) -> list[str]:
    found = kit.get("resourceclaim", "-n", namespace, claim)
    results = found.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return sorted(r["device"] for r in results)


def deallocated(kit: Kit, namespace: str, claim: str) -> bool:
    """The claim is deleted (made for the pod, it goes with it) or holds no device."""
    found = {c["metadata"]["name"]: c for c in kit.get("resourceclaims", "-n", namespace)["items"]}
    return claim not in found or not found[claim].get("status", {}).get("allocation")


def rule_status(kit: Kit, name: str) -> str:
    rule = kit.get("devicetaintrule", name)
    conditions = rule.get("status", {}).get("conditions", [])
    return "; ".join(f"{c['type']}={c['status']} ({c.get('reason')}): {c.get('message')}" for c in conditions)


def note(kit: Kit, text: str) -> None:
    kit.notes.append(f"dra-taints {text}")
    print(text)


def stays(kit: Kit, namespace: str, pod: str) -> None:
    """The pod still runs, is not being deleted, and was never marked for eviction."""
    found = pods(kit, namespace)[pod]
    assert found["status"].get("phase") == "Running", found["status"]
    assert "deletionTimestamp" not in found["metadata"], found["metadata"]
    assert not event_messages(kit, namespace, pod, EVICTION)


def refused(kit: Kit, namespace: str, pod: str) -> str:
    """Wait until a pod without a toleration, made while a NoExecute rule stands, is refused:
    not scheduled (FailedScheduling) or evicted; the first such message. It never runs on."""

    def seen() -> list[str]:
        failed = [f"FailedScheduling: {m}" for m in event_messages(kit, namespace, pod, "FailedScheduling")]
        return failed + [f"{EVICTION}: {m}" for m in event_messages(kit, namespace, pod, EVICTION)]

    (first, *_) = until(seen, f"{namespace}/{pod} not scheduled or evicted", 90)
    late = pods(kit, namespace).get(pod)
    assert (
        late is None or "deletionTimestamp" in late["metadata"] or late["status"].get("phase") == "Pending"
    ), late
    return str(first)


def test_noschedule_keeps_the_running_pod_and_holds_new_ones(kit: Kit, host: DraHost) -> None:
    name = "gpu-taint-noschedule"
    with scenario(kit, name) as docs:
        started = time.monotonic()
        kit.apply_all([docs["Namespace"], docs["single-gpu"], docs["pod-keeps-running"]])
        wait_running(kit, name, ["pod-keeps-running"])
        kit.timings[f"dra-taints {name}: pod-keeps-running applied -> running"] = since(started)
        gpu = one_gpu(gpu_env(kit, name, "pod-keeps-running"))

        kit.apply_all([docs["DeviceTaintRule"]])
        started = time.monotonic()
        kit.apply_all([docs["pod-no-schedule"]])
        message = first_event(kit, name, "pod-no-schedule", "FailedScheduling")
        kit.timings[f"dra-taints {name}: rule + pod-no-schedule -> FailedScheduling"] = round(
            time.monotonic() - started, 2
        )
        note(kit, f"{name} pod-no-schedule FailedScheduling ({GPUS - 1} GPUs free, all tainted): {message}")
        record_refusal(kit, name, "pod-no-schedule", message)
        found = pods(kit, name)
        assert found["pod-no-schedule"]["status"].get("phase") == "Pending", found["pod-no-schedule"][
            "status"
        ]
        assert not found["pod-no-schedule"]["spec"].get("nodeName"), found["pod-no-schedule"]["spec"]
        # NoSchedule does not touch what runs: the first pod is still there, with its GPU (a
        # NoExecute rule evicts within a second here: 5 s is ample to see one that should not)
        time.sleep(5)
        assert found["pod-keeps-running"]["status"].get("phase") == "Running", found["pod-keeps-running"][
            "status"
        ]
        assert "deletionTimestamp" not in found["pod-keeps-running"]["metadata"]
        assert not event_messages(kit, name, "pod-keeps-running", EVICTION)
        assert allocated(kit, name, claim_of(kit, name, "pod-keeps-running")) == [gpu]

        # the rule gone, the held pod is placed on a free GPU and runs
        started = time.monotonic()
        delete_rules(kit)
        wait_running(kit, name, ["pod-no-schedule"])
        kit.timings[f"dra-taints {name}: rule deleted -> pod-no-schedule running"] = round(
            time.monotonic() - started, 2
        )
        second = one_gpu(gpu_env(kit, name, "pod-no-schedule"))
        assert second != gpu, (gpu, second)
        record(kit, name, observed(kit, name, ["pod-keeps-running", "pod-no-schedule"], DRIVER))


def test_a_rule_naming_one_device_taints_only_that_device(kit: Kit, host: DraHost) -> None:
    name = "gpu-taint-one-device"
    with scenario(kit, name) as docs:
        slices = [s for s in kit.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
        (pool,) = {s["spec"]["pool"]["name"] for s in slices}
        rule = docs["DeviceTaintRule"]
        rule["spec"]["deviceSelector"]["pool"] = pool
        kit.apply_all([docs["Namespace"], rule, docs["gpu-2"], docs["any-gpu"]])
        started = time.monotonic()
        kit.apply_all([docs["pod-gpu-2"], docs["pod-any-gpu"]])
        wait_running(kit, name, ["pod-any-gpu"])
        kit.timings[f"dra-taints {name}: pod-any-gpu applied -> running"] = since(started)
        other = one_gpu(gpu_env(kit, name, "pod-any-gpu"))
        assert other != "gpu-2", other
        message = first_event(kit, name, "pod-gpu-2", "FailedScheduling")
        note(kit, f"{name} pod-gpu-2 FailedScheduling (gpu-2 of pool {pool} tainted): {message}")
        record_refusal(kit, name, "pod-gpu-2", message)
        assert pods(kit, name)["pod-gpu-2"]["status"].get("phase") == "Pending"

        started = time.monotonic()
        delete_rules(kit)
        wait_running(kit, name, ["pod-gpu-2"])
        kit.timings[f"dra-taints {name}: rule deleted -> pod-gpu-2 running"] = since(started)
        assert one_gpu(gpu_env(kit, name, "pod-gpu-2")) == "gpu-2"
        record(kit, name, observed(kit, name, ["pod-any-gpu", "pod-gpu-2"], DRIVER))


def test_noexecute_evicts_the_pod_without_a_toleration(kit: Kit, host: DraHost) -> None:
    name = "gpu-taint-noexecute"
    with scenario(kit, name) as docs:
        started = time.monotonic()
        kit.apply_all([docs[n] for n in ("Namespace", "single-gpu", "single-gpu-tolerating")])
        kit.apply_all([docs["pod-to-be-evicted"], docs["pod-tolerating"]])
        wait_running(kit, name, ["pod-to-be-evicted", "pod-tolerating"])
        kit.timings[f"dra-taints {name}: 2 pods applied -> running"] = since(started)
        evicted_gpu = one_gpu(gpu_env(kit, name, "pod-to-be-evicted"))
        tolerating_gpu = one_gpu(gpu_env(kit, name, "pod-tolerating"))
        claim = claim_of(kit, name, "pod-to-be-evicted")
        assert allocated(kit, name, claim) == [evicted_gpu]

        started = time.monotonic()
        kit.apply_all([docs["DeviceTaintRule"]])
        until(lambda: gone(kit, name, "pod-to-be-evicted"), "pod-to-be-evicted evicted", 60)
        kit.timings[f"dra-taints {name}: NoExecute rule -> pod-to-be-evicted deleted"] = round(
            time.monotonic() - started, 2
        )
        message = first_event(kit, name, "pod-to-be-evicted", EVICTION, 30)
        note(kit, f"{name} pod-to-be-evicted {EVICTION}: {message}")
        until(lambda: deallocated(kit, name, claim), f"claim {claim} deallocated", 90)
        until(
            lambda: [e for e in host.events("claim unprepared") if e.get("claim") == f"{name}/{claim}"],
            f"the host unpreparing {name}/{claim}",
            60,
        )
        kit.timings[f"dra-taints {name}: NoExecute rule -> claim unprepared and deallocated"] = round(
            time.monotonic() - started, 2
        )

        # a pod created while the rule stands never keeps running
        started = time.monotonic()
        kit.apply_all([docs["pod-no-execute"]])
        seen = refused(kit, name, "pod-no-execute")
        kit.timings[f"dra-taints {name}: pod-no-execute applied -> refused"] = since(started)
        note(kit, f"{name} pod-no-execute (created after the rule): {seen}")

        # the tolerating pod stayed, on its GPU
        stays(kit, name, "pod-tolerating")
        assert allocated(kit, name, claim_of(kit, name, "pod-tolerating")) == [tolerating_gpu]
        note(kit, f"{name} rule status: {rule_status(kit, name)}")


def test_a_tolerating_claim_is_given_a_tainted_gpu(kit: Kit, host: DraHost) -> None:
    name = "gpu-taint-toleration"
    with scenario(kit, name) as docs:
        kit.apply_all([docs["DeviceTaintRule"]])
        started = time.monotonic()
        templates = ("single-gpu-without-toleration", "single-gpu-with-toleration")
        kit.apply_all([docs["Namespace"], *(docs[t] for t in templates)])
        kit.apply_all([docs["pod-with-toleration"], docs["pod-without-toleration"]])
        wait_running(kit, name, ["pod-with-toleration"])
        kit.timings[f"dra-taints {name}: pod-with-toleration applied -> running"] = round(
            time.monotonic() - started, 2
        )
        gpu = one_gpu(gpu_env(kit, name, "pod-with-toleration"))
        assert allocated(kit, name, claim_of(kit, name, "pod-with-toleration")) == [gpu]

        note(kit, f"{name} pod-without-toleration: {refused(kit, name, 'pod-without-toleration')}")
        stays(kit, name, "pod-with-toleration")


def test_toleration_seconds_delays_the_eviction(kit: Kit, host: DraHost) -> None:
    name = "gpu-taint-eviction-time"
    with scenario(kit, name) as docs:
        three = ["pod-no-toleration", "pod-with-toleration", "pod-with-20s-toleration"]
        templates = [
            "single-gpu-without-toleration",
            "single-gpu-with-toleration",
            "single-gpu-with-20s-toleration",
        ]
        started = time.monotonic()
        kit.apply_all([docs["Namespace"], *(docs[t] for t in templates)])
        kit.apply_all([docs[p] for p in three])
        wait_running(kit, name, three)
        kit.timings[f"dra-taints {name}: 3 pods applied -> running"] = since(started)
        given = {p: one_gpu(gpu_env(kit, name, p)) for p in three}
        assert sorted(given.values()) == [f"gpu-{i}" for i in range(GPUS)], given
        record(kit, name, observed(kit, name, three, DRIVER))

        started = time.monotonic()
        kit.apply_all([docs["DeviceTaintRule"]])
        until(lambda: gone(kit, name, "pod-no-toleration"), "pod-no-toleration evicted", 60)
        at_once = since(started)
        kit.timings[f"dra-taints {name}: NoExecute rule -> pod-no-toleration deleted"] = at_once
        assert not gone(kit, name, "pod-with-20s-toleration") or at_once >= TOLERATION_SECONDS - 1
        until(
            lambda: gone(kit, name, "pod-with-20s-toleration"),
            "pod-with-20s-toleration evicted",
            90,
            every=0.25,
        )
        later = since(started)
        kit.timings[f"dra-taints {name}: NoExecute rule -> pod-with-20s-toleration deleted"] = later
        # (less 1 s: the taint's time is kept in whole seconds, and the eviction counts from it)
        assert later >= TOLERATION_SECONDS - 1, f"evicted after {later} s, tolerating {TOLERATION_SECONDS} s"
        for pod in ("pod-no-toleration", "pod-with-20s-toleration"):
            message = first_event(kit, name, pod, EVICTION, 30)
            note(kit, f"{name} {pod} {EVICTION}: {message}")
        stays(kit, name, "pod-with-toleration")
        note(kit, f"{name} rule status: {rule_status(kit, name)}")


def gizmo_config(node: str, unhealthy: list[str]) -> dict[str, Any]:
    return dra_config(node, {"gizmo": {"count": 2, "unhealthy": unhealthy}}, health_interval=1)


@pytest.fixture(scope="module")
def gizmo_host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    """A second host on the node: the gizmo fixture backend (2 gizmos, all healthy) through DRA."""
    kit = gated
    node = kit.node()["metadata"]["name"]
    kit.apply(GIZMO_CLASS)
    tmp = tmp_path_factory.mktemp("dra-taints-gizmo")
    started = time.monotonic()
    gizmos = DraHost.configured(tmp / "config.yaml", tmp / "host.log", gizmo_config(node, [])).start()
    try:
        gizmos.ready(lambda: device_count(kit, GIZMO_DRIVER) == 2, f"a ResourceSlice of {GIZMO_DRIVER}")
        kit.timings["dra-taints: gizmo host start -> 2 gizmos published"] = since(started)
        yield gizmos
    finally:
        if gizmos.running():
            kit.kubectl("delete", "pods", "-n", "gizmo-unhealthy", "--all", "--ignore-not-found",
                        "--wait=true", timeout=180)  # fmt: skip
        gizmos.stop()
        kit.kubectl("delete", "deviceclass", GIZMO_CLASS_NAME, "--ignore-not-found")
        gizmos.finish(kit, "dra-taints gizmo")


def gizmo_taints(kit: Kit) -> dict[str, list[dict[str, Any]]]:
    """Each published gizmo with its taints (none: an empty list)."""
    devices = [d for s in driver_slices(kit, GIZMO_DRIVER) for d in s["spec"].get("devices", [])]
    return {d["name"]: d.get("taints", []) for d in devices}


def test_an_unhealthy_device_is_published_with_a_taint_until_it_recovers(
    kit: Kit, gizmo_host: DraHost
) -> None:
    name = "gizmo-unhealthy"
    node = kit.node()["metadata"]["name"]
    (said,) = until(
        lambda: gizmo_host.events("unhealthy devices stay published with a taint"),
        "the gizmo host saying unhealthy devices stay published with a taint",
        10,
    )
    assert (said.get("driver"), said.get("key"), said.get("effect")) == (
        GIZMO_DRIVER,
        UNHEALTHY,
        "NoSchedule",
    )
    assert not gizmo_host.events("unhealthy devices are withdrawn: the API server drops device taints "
                                 "(DRADeviceTaints off)")  # fmt: skip
    assert gizmo_taints(kit) == {"gizmo-0": [], "gizmo-1": []}

    started = time.monotonic()
    gizmo_host.reload(gizmo_config(node, ["gizmo-1"]))
    taints = until(lambda: gizmo_taints(kit).get("gizmo-1"), "gizmo-1 published with a taint", 30)
    kit.timings["dra-taints gizmo: marked unhealthy -> taint in the slice"] = since(started)
    note(kit, f"{name} gizmo-1's taints in the slice: {json.dumps(taints)}")
    (taint,) = taints
    assert {k: v for k, v in taint.items() if k != "timeAdded"} == {
        "key": UNHEALTHY,
        "value": "true",
        "effect": "NoSchedule",
    }, taint
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", taint["timeAdded"]), taint
    assert gizmo_taints(kit)["gizmo-0"] == []  # still there, untainted: only gizmo-1 is sick

    with scenario(kit, name) as docs:
        kit.apply_all([docs["Namespace"], docs["gizmo-1"], docs["gizmo-1-tolerating"]])
        started = time.monotonic()
        kit.apply_all([docs["pod-intolerant"]])
        message = first_event(kit, name, "pod-intolerant", "FailedScheduling")
        kit.timings[f"dra-taints {name}: pod-intolerant applied -> FailedScheduling"] = since(started)
        note(kit, f"{name} pod-intolerant FailedScheduling (gizmo-1 tainted, free): {message}")
        record_refusal(kit, name, "pod-intolerant", message)
        found = pods(kit, name)["pod-intolerant"]
        assert found["status"].get("phase") == "Pending", found["status"]
        assert not found["spec"].get("nodeName"), found["spec"]

        # healthy again: the taint goes, the gizmo stays published, and the held pod runs on it
        started = time.monotonic()
        gizmo_host.reload(gizmo_config(node, []))
        until(lambda: gizmo_taints(kit) == {"gizmo-0": [], "gizmo-1": []}, "gizmo-1's taint gone", 30)
        kit.timings["dra-taints gizmo: marked healthy -> taint gone from the slice"] = since(started)
        note(kit, f"{name} gizmo-1 healthy again: taints {gizmo_taints(kit)}")
        wait_running(kit, name, ["pod-intolerant"], within=180)
        kit.timings[f"dra-taints {name}: gizmo-1 healthy -> pod-intolerant running"] = since(started)
        assert allocated(kit, name, "gizmo-1") == ["gizmo-1"]
        (prepared,) = [e for e in gizmo_host.events("claim prepared") if e.get("claim") == f"{name}/gizmo-1"]
        assert prepared["devices"] == ["gizmo-1"], prepared


def test_a_claim_tolerating_the_taint_runs_on_the_unhealthy_device(kit: Kit, gizmo_host: DraHost) -> None:
    name = "gizmo-unhealthy"
    node = kit.node()["metadata"]["name"]
    gizmo_host.reload(gizmo_config(node, ["gizmo-1"]))
    until(lambda: gizmo_taints(kit).get("gizmo-1"), "gizmo-1 published with a taint", 30)
    with scenario(kit, name) as docs:
        kit.apply_all([docs["Namespace"], docs["gizmo-1-tolerating"]])
        started = time.monotonic()
        kit.apply_all([docs["pod-tolerating"]])
        try:
            wait_running(kit, name, ["pod-tolerating"], within=60)
        except AssertionError as exc:
            refusals = [json.dumps(e) for e in gizmo_host.events("claim not prepared")]
            events = namespace_events(kit, name)
            note(kit, f"{name} pod-tolerating not running: {events[-1:]} host: {refusals[-1:]}")
            raise AssertionError(
                f"{exc}\nevents:\n" + "\n".join(events) + "\nhost:\n" + "\n".join(refusals)
            ) from None
        kit.timings[f"dra-taints {name}: pod-tolerating applied -> running"] = since(started)
        assert allocated(kit, name, "gizmo-1-tolerating") == ["gizmo-1"]
        (prepared,) = [
            e for e in gizmo_host.events("claim prepared") if e.get("claim") == f"{name}/gizmo-1-tolerating"
        ]
        assert prepared["devices"] == ["gizmo-1"], prepared
        env = printed_env(kit, name, "pod-tolerating", "ctr0")
        note(kit, f"{name} pod-tolerating/ctr0: {sorted(f'{k}={v}' for k, v in env.items() if 'GIZMO' in k)}")
        stays(kit, name, "pod-tolerating")
