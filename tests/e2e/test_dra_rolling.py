"""A rolling update of a DRA host on the kit's node, as ``components/surge`` runs one.

Host A (``devicehost run --backend dra-example``, the old DaemonSet pod) serves the GPUs and a
pod holding a claim runs. Host B (the new pod) starts beside it on the same node, with sockets of
its own; claim pods keep starting about every second, and older ones are deleted, while A is
stopped with SIGTERM. Checked: no prepare failed (no ``FailedPrepareDynamicResources``, no
``claim not prepared``), every pod ran with its GPU's environment, the driver's slices were
there the whole time (polled with ``kubectl get``, and watched: never deleted), and every claim
was unprepared once its pod went, the one A prepared by B, leaving the shared checkpoint empty.
The figures go to kit.timings and kit.notes.

The second test runs the update as operators do: the image built from the Dockerfile, deployed
with the example overlay and ``components/dra`` and ``components/surge``; a new pod template
rolls the DaemonSet (the new pod starts, is Ready, then the old one stops) while claim pods keep
starting, with the same checks, read from the API server, the pods' logs and the checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from drahost import (
    DraHost,
    claim_pod,
    container_env,
    driver_slices,
    namespace_events,
    printed_env,
    since,
    wait_running,
)
from k8skit import KUBELET_LOG, Kit, until
from overlays import write_own_overlay

REPO = Path(__file__).resolve().parents[2]
DEVICE_CLASS = REPO / "plugins" / "devicehost-dra-example" / "deploy" / "deviceclass.yaml"
DRIVER = "gpu.example.com"
GPUS = 8
NAMESPACE = "dra-rolling"
CHECKPOINT = Path("/var/lib/kubelet/plugins") / DRIVER / "devicehost-claims.json"
OVERLAP_PODS = 6
"""Claim pods started while both hosts serve (about one a second), before A is stopped."""
AFTER_PODS = 6
"""Claim pods started once A was told to stop."""
KEEP = 3
"""Claim pods kept running at once (older ones are deleted): the 8 GPUs never run out."""


def manifests(device_class: str = DRIVER) -> list[dict[str, Any]]:
    """The test's namespace and a ResourceClaimTemplate ``one`` asking for one device of ``device_class``."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"devicehost-e2e": "dra-rolling"}},
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": NAMESPACE, "name": "one"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]}}
        },
    }
    return [namespace, template]


def one_pod(name: str) -> dict[str, Any]:
    """A pod of the claim template ``one``."""
    return claim_pod(NAMESPACE, name, {"name": "dev", "resourceClaimTemplateName": "one"})


class SliceWatch:
    """The driver's published devices, polled with ``kubectl get`` every ``every`` s, and every
    DELETED event of its slices from ``kubectl get --watch``, until :meth:`stop`."""

    def __init__(self, kit: Kit, node: str, driver: str = DRIVER, every: float = 0.2) -> None:
        self.kit, self.node, self.driver, self.every = kit, node, driver, every
        self.samples: list[tuple[float, int]] = []
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._watch = subprocess.Popen(
            ["kubectl", "get", "resourceslices", "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=kit.env(),
            text=True,
        )
        self._poller.start()

    def _poll(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(AssertionError):  # kubectl failed: no sample, not a gap
                self.samples.append((time.monotonic(), node_devices(self.kit, self.node, self.driver)))
            self._stopping.wait(self.every)

    def stop(self) -> list[str]:
        """Stop polling and watching; the names of the driver's slices deleted meanwhile."""
        self._stopping.set()
        self._poller.join(timeout=30)
        self._watch.terminate()
        out, _ = self._watch.communicate(timeout=30)
        decoder, deleted, at = json.JSONDecoder(), [], 0
        while True:
            while at < len(out) and out[at].isspace():
                at += 1
            if at >= len(out):
                return deleted
            event, at = decoder.raw_decode(out, at)
            body = event.get("object", {})
            spec = body.get("spec", {})
            if event.get("type") == "DELETED" and (spec.get("driver"), spec.get("nodeName")) == (
                self.driver,
                self.node,
            ):
                deleted.append(body["metadata"]["name"])


def node_devices(kit: Kit, node: str, driver: str = DRIVER) -> int:
    """How many devices the driver's slices of ``node`` publish."""
    return sum(
        len(s["spec"].get("devices", []))
        for s in driver_slices(kit, driver)
        if s["spec"].get("nodeName") == node
    )


def delete_namespace(kit: Kit) -> None:
    kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture
def node(kit: Kit) -> Iterator[str]:
    kit.kubectl("apply", "-f", str(DEVICE_CLASS))
    delete_namespace(kit)  # left by a killed run
    try:
        yield kit.node()["metadata"]["name"]
    finally:
        kit.kubectl("delete", "deviceclass", DRIVER, "gpu-extended.example.com", "--ignore-not-found")


def uids(event: str, *hosts: DraHost) -> list[str]:
    """The claim UIDs of the hosts' log entries ``event``, in order, each entry once."""
    return [e["uid"] for h in hosts for e in h.events(event)]


def kubelet_lines(since: int) -> list[str]:
    """The kubelet's log lines about the driver written after offset ``since``."""
    with KUBELET_LOG.open("rb") as log:
        log.seek(since)
        return [ln for ln in log.read().decode(errors="replace").splitlines() if DRIVER in ln]


def start_pods(kit: Kit, old: DraHost, new: DraHost) -> dict[str, Any]:
    """Claim pods, one about every second, the oldest deleted once it ran and showed its GPU
    (KEEP stay); the old host is sent SIGTERM after OVERLAP_PODS. What happened: the pods, when
    the old host was told and when it exited, and the claims prepared before that (both served)."""
    assert old.process is not None
    seen: dict[str, Any] = {"pods": []}

    def exited() -> None:
        assert old.process is not None
        old.process.wait()
        seen["gone"] = time.monotonic()
        seen["during"] = len(uids("claim prepared", old)) - 1 + len(uids("claim prepared", new))

    for n in range(OVERLAP_PODS + AFTER_PODS):
        if n == OVERLAP_PODS:
            seen["told"] = time.monotonic()
            old.process.send_signal(signal.SIGTERM)  # as the kubelet stops the old DaemonSet pod
            threading.Thread(target=exited, daemon=True).start()
        kit.apply(one_pod(f"pod{n}"))
        seen["pods"].append(f"pod{n}")
        if len(seen["pods"]) > KEEP:
            oldest = seen["pods"][-KEEP - 1]
            shows_gpu(kit, oldest)
            kit.kubectl("delete", "pod", "-n", NAMESPACE, oldest, "--wait=false")
        time.sleep(1)
    assert old.stop() == 0, old.log.read_text()[-3000:]
    until(lambda: "during" in seen, "the old host's exit seen", 10)
    return seen


def shows_gpu(kit: Kit, pod: str) -> None:
    """The pod runs and its container was given a GPU of the driver."""
    wait_running(kit, NAMESPACE, [pod])
    env = container_env(kit, "dra rolling", NAMESPACE, pod, "ctr0", DRIVER)
    assert any(k.startswith("GPU_DEVICE_") for k in env), env


def test_a_rolling_update_prepares_every_claim_and_keeps_the_slices(
    kit: Kit, node: str, tmp_path: Path
) -> None:
    passed = False
    old = DraHost.backend("dra-example", node, tmp_path / "old.log").start()
    new = DraHost.backend("dra-example", node, tmp_path / "new.log")
    try:
        old.ready(lambda: node_devices(kit, node) == GPUS, f"{GPUS} GPUs of {DRIVER} on {node} published")
        elsewhere = [
            s["metadata"]["name"] for s in driver_slices(kit, DRIVER) if s["spec"].get("nodeName") != node
        ]
        kit.notes.extend(f"dra rolling: a slice of {DRIVER} not on {node}: {name}" for name in elsewhere)
        kit.apply_all(manifests())
        kit.apply(one_pod("holder"))
        shows_gpu(kit, "holder")
        (holder,) = uids("claim prepared", old)
        kubelet_from = kit.kubelet_log_offset()
        watch = SliceWatch(kit, node)
        started = time.monotonic()
        new.start()
        until(lambda: new.events("registered with the kubelet"), "the new host registered", 60)
        registered = time.monotonic()
        seen = start_pods(kit, old, new)
        created = seen["pods"]
        for pod in ["holder", *created[-KEEP:]]:
            shows_gpu(kit, pod)
        deleted = watch.stop()
        kit.timings["dra rolling: new host start -> registered"] = round(registered - started, 1)
        kit.timings["dra rolling: two instances serving"] = round(seen["gone"] - registered, 1)
        kit.timings["dra rolling: SIGTERM -> old host exited"] = round(seen["gone"] - seen["told"], 2)
        kit.notes.extend(f"dra rolling kubelet: {ln[:300]}" for ln in kubelet_lines(kubelet_from)[:12])
        missing = [round(at - started, 1) for at, count in watch.samples if count != GPUS]
        kit.notes.append(
            f"dra rolling: {len(watch.samples)} slice polls over {since(started)} s, {len(missing)} "
            f"without {GPUS} GPUs; slices deleted while watched: {deleted}"
        )
        assert not missing, f"slices missing at {missing} s after the new host started"
        assert not deleted, f"slices deleted during the update: {deleted}"
        kit.kubectl("delete", "pods", "-n", NAMESPACE, "--all", "--wait=true", timeout=180)
        by_old, by_new = uids("claim prepared", old), uids("claim prepared", new)
        prepared = by_old + by_new
        failed = [json.dumps(e) for e in old.events("claim not prepared") + new.events("claim not prepared")]
        failed += [e for e in namespace_events(kit, NAMESPACE) if "FailedPrepareDynamicResources" in e]
        kit.notes.append(
            f"dra rolling: claims prepared while both served {seen['during']}; in all by the old host "
            f"{len(by_old)}, by the new {len(by_new)}; failed prepares {len(failed)}"
        )
        assert not failed, failed
        assert sorted(set(prepared)) == sorted(prepared), "a claim prepared twice"
        assert len(prepared) == 1 + len(created), "a claim not prepared"
        until(
            lambda: set(prepared) <= set(uids("claim unprepared", old, new)),
            "every claim unprepared once its pod went",
            60,
        )
        assert holder in uids("claim unprepared", new), "the old host's claim is unprepared by the new one"
        assert json.loads(CHECKPOINT.read_text())["claims"] == {}
        passed = True
    finally:
        if not passed:  # what the hosts said last, in the session's report
            for tag, host in (("old", old), ("new", new)):
                if host.log.exists():
                    kit.notes.extend(
                        f"dra rolling {tag} host: {ln[:400]}"
                        for ln in host.log.read_text().splitlines()[-15:]
                    )
        delete_namespace(kit)
        for host in (old, new):
            if host.process is not None:
                host.finish(kit, "dra rolling")


# --- the same update as the DaemonSet runs it: the image, components/dra and components/surge ---

WIDGET_DRIVER = "example.com"
WIDGETS = 4
DAEMONSET = ("-n", "kube-system", "daemonset/devicehost")
HOST_PODS = ("pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=devicehost")
MIN_READY = 8
"""Seconds a new host pod is Ready before the DaemonSet stops the old one."""
OFFLINE_BUILD = ("--build-arg", "PYTHON_VERSION=3.11", "--build-arg", "PIP_NO_INDEX=1")


def shows_widget(kit: Kit, pod: str) -> str:
    """The pod runs and its container was given a widget (the example backend's env, by CDI)."""
    wait_running(kit, NAMESPACE, [pod])
    widget = printed_env(kit, NAMESPACE, pod, "ctr0").get("EXAMPLE_WIDGETS", "")
    assert widget.startswith("widget-"), f"{pod}: EXAMPLE_WIDGETS={widget!r}"
    return widget


def host_pod_names(kit: Kit) -> list[str]:
    """The DaemonSet's pods that have not been told to stop."""
    return sorted(
        p["metadata"]["name"]
        for p in kit.get(*HOST_PODS)["items"]
        if not p["metadata"].get("deletionTimestamp")
    )


def entries(log: str) -> list[dict[str, Any]]:
    """The host's JSON log lines (others passed over)."""
    found = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and "event" in entry:
                found.append(entry)
    return found


def seconds(since: str, until: str) -> float:
    """Seconds between two of the host's log timestamps."""
    parse = datetime.datetime.fromisoformat
    return round(
        (parse(until.replace("Z", "+00:00")) - parse(since.replace("Z", "+00:00"))).total_seconds(), 2
    )


def kit_patch(kit: Kit) -> dict[str, Any]:
    """A patch of the DaemonSet for the kit: the host reaches the API server at the node's address
    (the kit runs no kube-proxy, so the ``kubernetes`` Service's IP leads nowhere from a pod; the
    API server's certificate names the node's IP too), and a new pod counts as available only
    after MIN_READY s Ready, so the two hosts overlap long enough for claims to start meanwhile."""
    (address,) = [a["address"] for a in kit.node()["status"]["addresses"] if a["type"] == "InternalIP"]
    env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": address},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "devicehost", "namespace": "kube-system"},
        "spec": {
            "minReadySeconds": MIN_READY,
            "template": {"spec": {"containers": [{"name": "devicehost", "env": env}]}},
        },
    }


def test_the_daemonset_rolls_with_surge_while_claim_pods_start(
    kit: Kit, python_base: str, image_context: Path, tmp_path: Path
) -> None:
    tag = "localhost/devicehost:e2e-dra-rolling"
    kit.build_image(tag, image_context, "--build-arg", f"BASE_IMAGE={python_base}", *OFFLINE_BUILD,
                    "--build-arg", "BACKENDS=devicehost-example")  # fmt: skip
    node = kit.node()["metadata"]["name"]
    write_own_overlay(
        tmp_path,
        "example",
        ["dra", "surge"],
        images=[{"name": "devicehost", "newName": tag.split(":")[0], "newTag": tag.split(":")[1]}],
        patches=[{"patch": yaml.safe_dump(kit_patch(kit))}],
    )
    delete_namespace(kit)
    passed = False
    old_log = tmp_path / "old-pod.log"
    follow: subprocess.Popen[bytes] | None = None
    try:
        kit.kubectl("apply", "-k", str(tmp_path))
        kit.kubectl("rollout", "status", *DAEMONSET, "--timeout=180s", timeout=200)
        until(lambda: node_devices(kit, node, WIDGET_DRIVER) == WIDGETS, f"{WIDGETS} widgets published", 60)
        (old_pod,) = host_pod_names(kit)
        with old_log.open("wb") as out:  # its log, kept past its deletion
            follow = subprocess.Popen(
                ["kubectl", "logs", "-f", "-n", "kube-system", old_pod], stdout=out, env=kit.env()
            )
        kit.apply_all(manifests("widget.example.com"))
        kit.apply(one_pod("holder"))
        holder = shows_widget(kit, "holder")
        watch = SliceWatch(kit, node, WIDGET_DRIVER)
        started = time.monotonic()
        # A new pod template, as a new image gives one: the DaemonSet rolls (maxSurge 1).
        patch = {
            "spec": {"template": {"metadata": {"annotations": {"devicehost-e2e/rollout": str(started)}}}}
        }
        kit.kubectl("patch", *DAEMONSET, "--type", "merge", "-p", json.dumps(patch))
        created: list[str] = []
        while len(created) < 12:
            kit.apply(one_pod(f"pod{len(created)}"))
            created.append(f"pod{len(created)}")
            if len(created) > 2:  # 4 widgets: the holder, two pods, one starting
                shows_widget(kit, created[-3])
                kit.kubectl("delete", "pod", "-n", NAMESPACE, created[-3], "--wait=false")
            time.sleep(1)
        kit.kubectl("rollout", "status", *DAEMONSET, "--timeout=120s", timeout=150)
        (new_pod,) = host_pod_names(kit)
        assert new_pod != old_pod
        follow.wait(timeout=30)  # the old pod's log ended with it
        old_said = entries(old_log.read_text())
        new_said = entries(kit.logs("-n", "kube-system", new_pod))
        registered = next(e["timestamp"] for e in new_said if e["event"] == "registered with the kubelet")
        withdrawn = next(e["timestamp"] for e in old_said if e["event"] == "DRA withdrawn")
        during = [
            e
            for e in old_said + new_said
            if e["event"] == "claim prepared" and registered < e["timestamp"] < withdrawn
        ]
        assert any(e["event"].startswith("another instance serves the driver here") for e in old_said)
        for pod in ["holder", *created[-2:]]:
            shows_widget(kit, pod)
        deleted = watch.stop()
        missing = [round(at - started, 1) for at, count in watch.samples if count != WIDGETS]
        failed = [e for e in namespace_events(kit, NAMESPACE) if "FailedPrepareDynamicResources" in e]
        kit.timings["dra rolling DaemonSet: new pod registered -> old pod's driver withdrawn"] = seconds(
            registered, withdrawn
        )
        kit.notes.append(
            f"dra rolling DaemonSet: {old_pod} -> {new_pod}, {len(created)} claim pods over "
            f"{since(started)} s, holder kept {holder}; claims prepared while both served {len(during)}; "
            f"{len(watch.samples)} slice polls, {len(missing)} without {WIDGETS} widgets, slices deleted: "
            f"{deleted}; failed prepares {len(failed)}"
        )
        assert not failed, failed
        assert not missing, f"slices missing at {missing} s after the rollout began"
        assert not deleted, deleted
        kit.kubectl("delete", "pods", "-n", NAMESPACE, "--all", "--wait=true", timeout=180)
        checkpoint = Path("/var/lib/kubelet/plugins") / WIDGET_DRIVER / "devicehost-claims.json"
        until(lambda: json.loads(checkpoint.read_text())["claims"] == {}, "every claim unprepared", 60)
        unprepared = [
            ln for ln in kit.logs("-n", "kube-system", new_pod).splitlines() if "claim unprepared" in ln
        ]
        assert any("holder" in ln for ln in unprepared), "the old pod's claim is unprepared by the new pod"
        passed = True
    finally:
        if follow is not None:
            follow.kill()
        if not passed:
            for pod in host_pod_names(kit):
                kit.notes.append(f"dra rolling DaemonSet {pod}: {kit.logs('-n', 'kube-system', pod)[-3000:]}")
        delete_namespace(kit)
        kit.kubectl("delete", "-k", str(tmp_path), "--ignore-not-found", "--wait=true", timeout=180)
