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

The API needs alpha gates in 1.35: DRADeviceTaints (taints and tolerations) and
DRADeviceTaintRules (the DeviceTaintRule API and its eviction controller), on the API server,
controller-manager, scheduler and kubelet, and ``--runtime-config=resource.k8s.io/v1alpha3=true``
on the API server (the version that serves ``devicetaintrules`` here; the reference's manifests
say v1beta2). Both are set for this module and taken away after it. DRADeviceTaints alone is
not enough: the API server serves and accepts the rules, but the NoSchedule rule kept no pod off
its GPUs (no FailedScheduling within 90 s; tried on v1.35.6). Times go to
``kit.timings``, what the containers printed, the scheduler's and the eviction controller's
messages to ``kit.notes``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8skit import DEVICE_PLUGINS_DIR, Kit, until

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = Path(__file__).resolve().parent / "manifests"
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
ADMIN_KUBECONFIG = "/var/lib/k8s-kit/pki/admin.kubeconfig"
DRIVER = "gpu.example.com"
GPUS = 3
SETTINGS = {"dra-example": {"num_gpus": GPUS}}
GATES = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}
APIS = {"resource.k8s.io/v1alpha3": True}
LABEL = "devicehost-e2e=dra-taints"
GPU_KEY = re.compile(r"^GPU_DEVICE_(\d+)$")
STUCK = {"ErrImageNeverPull", "CreateContainerError", "CreateContainerConfigError", "CrashLoopBackOff"}
EVICTION = "DeviceTaintManagerEviction"
TOLERATION_SECONDS = 20


class Host:
    """``devicehost run --backend dra-example`` with 3 GPUs on the node; its JSON log lines."""

    def __init__(self, node: str, log: Path) -> None:
        self.log = log
        command = [
            str(Path(sys.executable).parent / "devicehost"), "run",
            "--backend", "dra-example",
            "--backend-settings", json.dumps(SETTINGS),
            "--node-name", node,
            "--kubeconfig", ADMIN_KUBECONFIG,
            "--device-plugins-dir", str(DEVICE_PLUGINS_DIR),
            "--log-format", "json",
        ]  # fmt: skip
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def events(self, event: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == event:
                found.append(entry)
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def published(kit: Kit) -> bool:
    slices = [s for s in kit.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    return sum(len(s["spec"].get("devices", [])) for s in slices) == GPUS


def delete_rules(kit: Kit) -> None:
    kit.kubectl("delete", "devicetaintrules", "-l", LABEL, "--ignore-not-found", "--wait=true")


def delete_scenarios(kit: Kit) -> None:
    """Rules first (a NoExecute rule would evict the pods being deleted), then the pods (the
    kubelet unprepares their claims through the host), then the namespaces."""
    delete_rules(kit)
    kit.kubectl("delete", "pods", "-A", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)
    kit.kubectl("delete", "namespaces", "-l", LABEL, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture(scope="module")
def gated(kit: Kit) -> Iterator[Kit]:
    """DRADeviceTaints and DRADeviceTaintRules on, resource.k8s.io/v1alpha3 served, for this
    module; the kit's gates and API versions (none) again after it."""
    started = time.monotonic()
    kit.set_feature_gates(GATES, runtime_config=APIS)
    kit.timings["dra-taints: gates + v1alpha3 on (4 daemons restarted)"] = round(
        time.monotonic() - started, 1
    )
    try:
        until(lambda: _serves_rules(kit), "the API server serving devicetaintrules", within=60)
        yield kit
    finally:
        kit.set_feature_gates({}, runtime_config={})


def _serves_rules(kit: Kit) -> bool:
    try:
        out = kit.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name", timeout=30)
    except AssertionError:
        return False
    return "devicetaintrules.resource.k8s.io" in out.split()


@pytest.fixture(scope="module")
def host(gated: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    kit = gated
    node = kit.node()["metadata"]["name"]
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    delete_scenarios(kit)  # left by a killed run
    started = time.monotonic()
    gpu_host = Host(node, tmp_path_factory.mktemp("dra-taints") / "host.log")
    try:
        until(lambda: published(kit), f"a ResourceSlice of {DRIVER} with {GPUS} GPUs", within=60)
        until(lambda: gpu_host.events("registered with the kubelet"), "the kubelet registered it", 30)
        kit.timings["dra-taints: host start -> 3 GPUs published"] = since(started)
        yield gpu_host
    finally:
        if gpu_host.process.poll() is None:
            delete_scenarios(kit)
        code = gpu_host.stop()
        kit.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found")
        for entry in gpu_host.events("claim not prepared") + gpu_host.events("claim not unprepared"):
            kit.notes.append(f"dra-taints host: {json.dumps(entry)}")
        assert code == 0, f"devicehost exited {code}: {gpu_host.log.read_text()[-3000:]}"


@contextmanager
def scenario(kit: Kit, name: str) -> Iterator[dict[str, dict[str, Any]]]:
    """``manifests/<name>.yaml``'s documents by name; its rule and namespace deleted after the
    scenario whatever happened."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text()) if d]
    try:
        by_kind = {"Namespace", "DeviceTaintRule"}  # one each: found by kind, the rest by name
        yield {d["kind"] if d["kind"] in by_kind else d["metadata"]["name"]: d for d in docs}
    finally:
        delete_rules(kit)
        kit.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=180)


def apply(kit: Kit, docs: Sequence[dict[str, Any]]) -> None:
    kit.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))


def pods(kit: Kit, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kit.get("pods", "-n", namespace)["items"]}


def wait_running(kit: Kit, namespace: str, names: Sequence[str], within: float = 120) -> None:
    def running() -> bool:
        found = pods(kit, namespace)
        for name in names:
            status = found.get(name, {}).get("status", {})
            assert status.get("phase") != "Failed", f"{namespace}/{name} failed: {status}"
            waiting = [s["state"].get("waiting", {}) for s in status.get("containerStatuses", [])]
            stuck = [w for w in waiting if w.get("reason") in STUCK]
            assert not stuck, f"{namespace}/{name}: {stuck}"
        return all(found.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

    until(running, f"pods {', '.join(names)} of {namespace} running", within=within)


def gone(kit: Kit, namespace: str, name: str) -> bool:
    """The pod is deleted or being deleted."""
    pod = pods(kit, namespace).get(name)
    return pod is None or "deletionTimestamp" in pod["metadata"]


def events(kit: Kit, namespace: str, name: str, reason: str) -> list[str]:
    found = kit.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return [e["message"] for e in found["items"] if e["reason"] == reason]


def container_env(kit: Kit, namespace: str, pod: str) -> dict[str, str]:
    """What ctr0 printed (``ENV KEY=VALUE``); its GPU and DRA lines go to the report."""
    lines = until(
        lambda: [
            ln for ln in kit.logs("-n", namespace, pod, "-c", "ctr0").splitlines() if ln.startswith("ENV ")
        ],
        f"{namespace}/{pod} printing its environment",
        within=30,
    )
    env = dict(line.removeprefix("ENV ").partition("=")[::2] for line in lines)
    shown = sorted(f"{k}={v}" for k, v in env.items() if k.startswith(("GPU_DEVICE_", "DRA_")))
    kit.notes.append(f"dra-taints {namespace} {pod}/ctr0: {' '.join(shown)}")
    print(f"{namespace} {pod}/ctr0:", *shown, sep="\n  ")
    assert env.get("DRA_RESOURCE_DRIVER_NAME") == DRIVER, shown
    return env


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


def since(started: float) -> float:
    return round(time.monotonic() - started, 2)


def note(kit: Kit, text: str) -> None:
    kit.notes.append(f"dra-taints {text}")
    print(text)


def stays(kit: Kit, namespace: str, pod: str) -> None:
    """The pod still runs, is not being deleted, and was never marked for eviction."""
    found = pods(kit, namespace)[pod]
    assert found["status"].get("phase") == "Running", found["status"]
    assert "deletionTimestamp" not in found["metadata"], found["metadata"]
    assert not events(kit, namespace, pod, EVICTION)


def refused(kit: Kit, namespace: str, pod: str) -> str:
    """Wait until a pod without a toleration, made while a NoExecute rule stands, is refused:
    not scheduled (FailedScheduling) or evicted; the first such message. It never runs on."""

    def seen() -> list[str]:
        failed = [f"FailedScheduling: {m}" for m in events(kit, namespace, pod, "FailedScheduling")]
        return failed + [f"{EVICTION}: {m}" for m in events(kit, namespace, pod, EVICTION)]

    (first, *_) = until(seen, f"{namespace}/{pod} not scheduled or evicted", 90)
    late = pods(kit, namespace).get(pod)
    assert (
        late is None or "deletionTimestamp" in late["metadata"] or late["status"].get("phase") == "Pending"
    ), late
    return str(first)


def test_noschedule_keeps_the_running_pod_and_holds_new_ones(kit: Kit, host: Host) -> None:
    name = "gpu-taint-noschedule"
    with scenario(kit, name) as docs:
        started = time.monotonic()
        apply(kit, [docs["Namespace"], docs["single-gpu"], docs["pod-keeps-running"]])
        wait_running(kit, name, ["pod-keeps-running"])
        kit.timings[f"dra-taints {name}: pod-keeps-running applied -> running"] = since(started)
        gpu = one_gpu(container_env(kit, name, "pod-keeps-running"))

        apply(kit, [docs["DeviceTaintRule"]])
        started = time.monotonic()
        apply(kit, [docs["pod-no-schedule"]])
        (message, *_) = until(
            lambda: events(kit, name, "pod-no-schedule", "FailedScheduling"),
            "pod-no-schedule FailedScheduling",
            90,
        )
        kit.timings[f"dra-taints {name}: rule + pod-no-schedule -> FailedScheduling"] = round(
            time.monotonic() - started, 2
        )
        note(kit, f"{name} pod-no-schedule FailedScheduling ({GPUS - 1} GPUs free, all tainted): {message}")
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
        assert not events(kit, name, "pod-keeps-running", EVICTION)
        assert allocated(kit, name, claim_of(kit, name, "pod-keeps-running")) == [gpu]

        # the rule gone, the held pod is placed on a free GPU and runs
        started = time.monotonic()
        delete_rules(kit)
        wait_running(kit, name, ["pod-no-schedule"])
        kit.timings[f"dra-taints {name}: rule deleted -> pod-no-schedule running"] = round(
            time.monotonic() - started, 2
        )
        second = one_gpu(container_env(kit, name, "pod-no-schedule"))
        assert second != gpu, (gpu, second)


def test_a_rule_naming_one_device_taints_only_that_device(kit: Kit, host: Host) -> None:
    name = "gpu-taint-one-device"
    with scenario(kit, name) as docs:
        slices = [s for s in kit.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
        (pool,) = {s["spec"]["pool"]["name"] for s in slices}
        rule = docs["DeviceTaintRule"]
        rule["spec"]["deviceSelector"]["pool"] = pool
        apply(kit, [docs["Namespace"], rule, docs["gpu-2"], docs["any-gpu"]])
        started = time.monotonic()
        apply(kit, [docs["pod-gpu-2"], docs["pod-any-gpu"]])
        wait_running(kit, name, ["pod-any-gpu"])
        kit.timings[f"dra-taints {name}: pod-any-gpu applied -> running"] = since(started)
        other = one_gpu(container_env(kit, name, "pod-any-gpu"))
        assert other != "gpu-2", other
        (message, *_) = until(
            lambda: events(kit, name, "pod-gpu-2", "FailedScheduling"), "pod-gpu-2 FailedScheduling", 90
        )
        note(kit, f"{name} pod-gpu-2 FailedScheduling (gpu-2 of pool {pool} tainted): {message}")
        assert pods(kit, name)["pod-gpu-2"]["status"].get("phase") == "Pending"

        started = time.monotonic()
        delete_rules(kit)
        wait_running(kit, name, ["pod-gpu-2"])
        kit.timings[f"dra-taints {name}: rule deleted -> pod-gpu-2 running"] = since(started)
        assert one_gpu(container_env(kit, name, "pod-gpu-2")) == "gpu-2"


def test_noexecute_evicts_the_pod_without_a_toleration(kit: Kit, host: Host) -> None:
    name = "gpu-taint-noexecute"
    with scenario(kit, name) as docs:
        started = time.monotonic()
        apply(kit, [docs[n] for n in ("Namespace", "single-gpu", "single-gpu-tolerating")])
        apply(kit, [docs["pod-to-be-evicted"], docs["pod-tolerating"]])
        wait_running(kit, name, ["pod-to-be-evicted", "pod-tolerating"])
        kit.timings[f"dra-taints {name}: 2 pods applied -> running"] = since(started)
        evicted_gpu = one_gpu(container_env(kit, name, "pod-to-be-evicted"))
        tolerating_gpu = one_gpu(container_env(kit, name, "pod-tolerating"))
        claim = claim_of(kit, name, "pod-to-be-evicted")
        assert allocated(kit, name, claim) == [evicted_gpu]

        started = time.monotonic()
        apply(kit, [docs["DeviceTaintRule"]])
        until(lambda: gone(kit, name, "pod-to-be-evicted"), "pod-to-be-evicted evicted", 60)
        kit.timings[f"dra-taints {name}: NoExecute rule -> pod-to-be-evicted deleted"] = round(
            time.monotonic() - started, 2
        )
        (message, *_) = until(
            lambda: events(kit, name, "pod-to-be-evicted", EVICTION),
            f"pod-to-be-evicted {EVICTION} event",
            30,
        )
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
        apply(kit, [docs["pod-no-execute"]])
        seen = refused(kit, name, "pod-no-execute")
        kit.timings[f"dra-taints {name}: pod-no-execute applied -> refused"] = since(started)
        note(kit, f"{name} pod-no-execute (created after the rule): {seen}")

        # the tolerating pod stayed, on its GPU
        stays(kit, name, "pod-tolerating")
        assert allocated(kit, name, claim_of(kit, name, "pod-tolerating")) == [tolerating_gpu]
        note(kit, f"{name} rule status: {rule_status(kit, name)}")


def test_a_tolerating_claim_is_given_a_tainted_gpu(kit: Kit, host: Host) -> None:
    name = "gpu-taint-toleration"
    with scenario(kit, name) as docs:
        apply(kit, [docs["DeviceTaintRule"]])
        started = time.monotonic()
        templates = ("single-gpu-without-toleration", "single-gpu-with-toleration")
        apply(kit, [docs["Namespace"], *(docs[t] for t in templates)])
        apply(kit, [docs["pod-with-toleration"], docs["pod-without-toleration"]])
        wait_running(kit, name, ["pod-with-toleration"])
        kit.timings[f"dra-taints {name}: pod-with-toleration applied -> running"] = round(
            time.monotonic() - started, 2
        )
        gpu = one_gpu(container_env(kit, name, "pod-with-toleration"))
        assert allocated(kit, name, claim_of(kit, name, "pod-with-toleration")) == [gpu]

        note(kit, f"{name} pod-without-toleration: {refused(kit, name, 'pod-without-toleration')}")
        stays(kit, name, "pod-with-toleration")


def test_toleration_seconds_delays_the_eviction(kit: Kit, host: Host) -> None:
    name = "gpu-taint-eviction-time"
    with scenario(kit, name) as docs:
        three = ["pod-no-toleration", "pod-with-toleration", "pod-with-20s-toleration"]
        templates = [
            "single-gpu-without-toleration",
            "single-gpu-with-toleration",
            "single-gpu-with-20s-toleration",
        ]
        started = time.monotonic()
        apply(kit, [docs["Namespace"], *(docs[t] for t in templates)])
        apply(kit, [docs[p] for p in three])
        wait_running(kit, name, three)
        kit.timings[f"dra-taints {name}: 3 pods applied -> running"] = since(started)
        given = {p: one_gpu(container_env(kit, name, p)) for p in three}
        assert sorted(given.values()) == [f"gpu-{i}" for i in range(GPUS)], given

        started = time.monotonic()
        apply(kit, [docs["DeviceTaintRule"]])
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
            (message, *_) = until(lambda p=pod: events(kit, name, p, EVICTION), f"{pod} {EVICTION} event", 30)
            note(kit, f"{name} {pod} {EVICTION}: {message}")
        stays(kit, name, "pod-with-toleration")
        note(kit, f"{name} rule status: {rule_status(kit, name)}")
