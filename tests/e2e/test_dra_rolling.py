"""A rolling update of a DRA host on the kit's node, as ``components/surge`` runs one.

Host A (``devicehost run --backend dra-example``, the old DaemonSet pod) serves the GPUs and a
pod holding a claim runs. Host B (the new pod) starts beside it on the same node, with sockets of
its own; claim pods keep starting about every second, and older ones are deleted, while A is
stopped with SIGTERM. Checked: no prepare failed (no ``FailedPrepareDynamicResources``, no
``claim not prepared``), every pod ran with its GPU's environment, the driver's slices were
there the whole time (polled with ``kubectl get``, and watched: never deleted), and every claim
was unprepared once its pod went, the one A prepared by B, leaving the shared checkpoint empty.
The figures go to kit.timings and kit.notes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drahost import DraHost, container_env, driver_slices, namespace_events, since, wait_running
from k8skit import KUBELET_LOG, Kit, until

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


def manifests() -> list[dict[str, Any]]:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"devicehost-e2e": "dra-rolling"}},
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": NAMESPACE, "name": "one-gpu"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
        },
    }
    return [namespace, template]


def claim_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NAMESPACE, "name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [
                {
                    "name": "ctr0",
                    "image": "localhost/envsleep:v1",
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


class SliceWatch:
    """The driver's published devices, polled with ``kubectl get`` every ``every`` s, and every
    DELETED event of its slices from ``kubectl get --watch``, until :meth:`stop`."""

    def __init__(self, kit: Kit, node: str, every: float = 0.2) -> None:
        self.kit, self.node, self.every = kit, node, every
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
                self.samples.append((time.monotonic(), node_devices(self.kit, self.node)))
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
                DRIVER,
                self.node,
            ):
                deleted.append(body["metadata"]["name"])


def node_devices(kit: Kit, node: str) -> int:
    """How many devices the driver's slices of ``node`` publish."""
    return sum(
        len(s["spec"].get("devices", []))
        for s in driver_slices(kit, DRIVER)
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
        kit.apply(claim_pod(f"pod{n}"))
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
        kit.apply(claim_pod("holder"))
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
