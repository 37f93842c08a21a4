"""deploy/components/webhook in real pods, deployed as deploy/README.md (section 9) tells operators.

The node image is built from the Dockerfile with the example and dra-example backends (so the
webhook knows gpu.example.com's ``GpuConfig``); ``devicehost webhook-cert`` makes the
certificate, ``kubectl create secret tls`` the Secret, and a user's own overlay (the example
overlay, its config enabling dra-example, components/dra and components/webhook, the printed
caBundle patched in) is applied with ``kubectl apply -k``. The Deployment's pods must become
Ready by their own probes, as the non-root user the manifest names.

The kit runs no kube-proxy, so nothing routes a Service's ClusterIP. An API server calls a
webhook's Service at its ClusterIP, unless it runs with ``--enable-aggregator-routing=true``: then
it resolves the Service to one of its ready endpoints, a pod IP, which the node routes. The
shipped configuration is first seen unreachable (``failurePolicy: Ignore``: a bad claim is
admitted unchecked, as the docs say for a webhook that is down); then the API server is
restarted with that flag, standing in for kube-proxy, and restarted without it at the end.
Nothing else differs from the operator's path: the configuration's service reference (port 443
to the pods' 8443), the caBundle from the overlay, the certificate's name
devicehost-webhook.kube-system.svc, which the API server checks whichever address it dials.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuclaims import BAD, DENIED, DRIVER, GOOD, KEY_PATH, MODEL_WORDS, claim, template
from k8skit import KIT_LOGS, Kit, until
from overlays import DEPLOY, readme_ca_bundle_patches, write_own_overlay

pytest.importorskip("cryptography")

DEVICEHOST = str(Path(sys.executable).parent / "devicehost")
TAG = "localhost/devicehost:e2e-webhook"
NAMESPACE = "kube-system"
WEBHOOK = "devicehost-webhook"
SELECTOR = "app.kubernetes.io/name=devicehost,app.kubernetes.io/component=webhook"
SERVICE_NAME = f"{WEBHOOK}.{NAMESPACE}.svc"
"""The name the API server checks in the webhook's certificate (service reference)."""
ROUTING = "--enable-aggregator-routing"
PATH = "/validate-resource-claim"
OFFLINE_BUILD = ("--build-arg", "PYTHON_VERSION=3.11", "--build-arg", "PIP_NO_INDEX=1")


@dataclass
class Deployed:
    overlay: Path
    certs: Path
    applied_at: float


def answer(kit: Kit, obj: dict[str, Any], *, dry_run: bool = True) -> str | None:
    """``kubectl apply`` of ``obj``: None when admitted, else kubectl's error output."""
    args = ("apply", "--dry-run=server", "-f", "-") if dry_run else ("apply", "-f", "-")
    try:
        kit.kubectl(*args, stdin=json.dumps(obj))
    except AssertionError as refused:
        return " ".join(ln.strip() for ln in str(refused).splitlines()[1:] if ln.strip())
    return None


def webhook_pods(kit: Kit) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kit.get("pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def readyz(pod_ip: str, ca: Path) -> dict[str, Any]:
    """``GET /readyz`` from the node to the pod, trusting only ``ca`` and checking the Service's
    name in the certificate, as the API server does."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((pod_ip, 8443), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=SERVICE_NAME) as tls,
    ):
        tls.sendall(f"GET /readyz HTTP/1.0\r\nHost: {SERVICE_NAME}\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split()[1] == b"200", head
    found: dict[str, Any] = json.loads(body)
    return found


def seconds(start: str, end: str) -> float:
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def operator_overlay(directory: Path, ca_bundle: str) -> None:
    """The user's overlay: the example overlay with dra-example enabled too, components/dra and
    components/webhook, the image, and README section 9's caBundle patch as written there."""
    config = yaml.safe_load((DEPLOY / "overlays" / "example" / "config.yaml").read_text())
    config["enabled_backends"] = ["example", "dra-example"]
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    write_own_overlay(
        directory, "example", ["dra", "webhook"],
        configMapGenerator=[{"name": "devicehost-config", "behavior": "replace", "files": ["config.yaml"]}],
        images=[{"name": "devicehost", "newName": TAG.split(":")[0], "newTag": TAG.split(":")[1]}],
        patches=readme_ca_bundle_patches(ca_bundle),
    )  # fmt: skip


@pytest.fixture(scope="module")
def deployed(
    kit: Kit, python_base: str, image_context: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    kit.build_image(TAG, image_context, "--build-arg", f"BASE_IMAGE={python_base}", *OFFLINE_BUILD,
                    "--build-arg", "BACKENDS=devicehost-example devicehost-dra-example")  # fmt: skip
    work = tmp_path_factory.mktemp("webhook-deploy")
    certs, overlay = work / "certs", work / "overlay"
    overlay.mkdir()
    # README section 9, without cert-manager: the certificate, the Secret, the caBundle.
    made = subprocess.run(
        [DEVICEHOST, "webhook-cert", "--out-dir", str(certs), "--namespace", NAMESPACE],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    kit.notes.append(f"webhook-cert: {made.stderr.strip()}")
    kit.kubectl("-n", NAMESPACE, "delete", "secret", "devicehost-webhook-tls", "--ignore-not-found")
    kit.kubectl("-n", NAMESPACE, "create", "secret", "tls", "devicehost-webhook-tls",
                f"--cert={certs / 'tls.crt'}", f"--key={certs / 'tls.key'}")  # fmt: skip
    operator_overlay(overlay, made.stdout.strip())
    applied_at = time.monotonic()
    kit.kubectl("apply", "-k", str(overlay))
    try:
        yield Deployed(overlay, certs, applied_at)
    finally:
        kit.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true", timeout=180)
        kit.kubectl("-n", NAMESPACE, "delete", "secret", "devicehost-webhook-tls", "--ignore-not-found")
        kit.kubectl("-n", "default", "delete", "resourceclaim", "webhook-e2e-good", "--ignore-not-found")


def test_the_webhook_pods_become_ready_as_the_non_root_user(kit: Kit, deployed: Deployed) -> None:
    kit.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{WEBHOOK}", "--timeout=180s", timeout=200)
    kit.timings["webhook: kubectl apply -k -> Deployment rolled out (2 pods Ready)"] = round(
        time.monotonic() - deployed.applied_at, 1
    )
    pods = webhook_pods(kit)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod["status"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", status
        container = status["containerStatuses"][0]
        assert container["restartCount"] == 0, f"{name}: the liveness probe restarted it"
        assert container["image"].endswith(TAG.split("/")[-1]), container["image"]
        started = container["state"]["running"]["startedAt"]
        kit.notes.append(
            f"webhook pod {name}: created -> Ready "
            f"{seconds(pod['metadata']['creationTimestamp'], ready['lastTransitionTime']):.0f} s, "
            f"container started -> Ready {seconds(started, ready['lastTransitionTime']):.0f} s"
        )
        proc = kit.kubectl("-n", NAMESPACE, "exec", name, "-c", "webhook", "--", "cat", "/proc/1/status")
        ids = {
            ln.split(":")[0]: ln.split()[1:] for ln in proc.splitlines() if ln.startswith(("Uid:", "Gid:"))
        }
        assert ids == {"Uid": ["65534"] * 4, "Gid": ["65534"] * 4}, ids
        drivers = readyz(status["podIP"], deployed.certs / "ca.crt")["drivers"]
        assert drivers[DRIVER] == "dra-example", drivers
        events = kit.get("events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}")
        failures = [e["message"] for e in events["items"] if e["reason"] == "Unhealthy"]
        kit.notes.append(f"webhook pod {name}: uid/gid 65534, /readyz {drivers}, probe failures {failures}")


def test_without_kube_proxy_the_service_is_not_reached_and_ignore_admits(
    kit: Kit, deployed: Deployed
) -> None:
    """The kit's API server, as up.sh starts it, dials the Service's ClusterIP, which no node
    rule sends to the pods: the webhook is not reached, and failurePolicy Ignore admits the bad
    claim, after at most timeoutSeconds (5). (On the machine this was written on, the packets
    left by the default route and a TLS-intercepting proxy answered at once with its own
    certificate, which the caBundle refused; elsewhere the call times out.)"""
    log = KIT_LOGS / "kube-apiserver.log"
    offset = log.stat().st_size
    started = time.monotonic()
    assert answer(kit, claim(BAD)) is None
    took = time.monotonic() - started
    assert took < 10, took
    with log.open("rb") as lines:
        lines.seek(offset)
        said = [ln for ln in lines.read().decode(errors="replace").splitlines() if "calling webhook" in ln]
    assert said, "the API server logged no webhook call failure"
    assert f"https://{SERVICE_NAME}:443{PATH}" in said[0], said[0]
    kit.notes.append(f"webhook by ClusterIP, no kube-proxy: admitted unchecked after {took:.1f} s; {said[0]}")


@pytest.fixture(scope="module")
def routed(kit: Kit, deployed: Deployed) -> Iterator[None]:
    """The API server calling Services at their endpoints (the pods) for the rest of the module."""
    kit.restart_apiserver({ROUTING: "true"})
    try:
        yield
    finally:
        kit.restart_apiserver({ROUTING: None})


def test_through_the_service_an_invalid_claim_is_refused_and_a_valid_one_admitted(
    kit: Kit, routed: None
) -> None:
    message = until(lambda: answer(kit, claim(BAD), dry_run=False), "the webhook's refusal", within=60)
    kit.notes.append(f"webhook in a pod, kubectl apply refused: {message}")
    assert DENIED in message
    assert f"{KEY_PATH}: {MODEL_WORDS} (got 'Forever')" in message
    stored = kit.kubectl("get", "resourceclaims", "-n", "default", "-o", "name").split()
    assert "resourceclaim.resource.k8s.io/webhook-e2e" not in stored, stored
    assert answer(kit, claim(GOOD, name="webhook-e2e-good"), dry_run=False) is None
    assert kit.get("resourceclaim", "-n", "default", "webhook-e2e-good")["spec"]["devices"]["config"]
    assert answer(kit, claim({"any": 1}, driver="gpu.other.example.com")) is None
    refused_template = answer(kit, template(BAD))
    assert refused_template is not None
    assert f"spec.{KEY_PATH}" in refused_template
    logs = [kit.logs("-n", NAMESPACE, p["metadata"]["name"]) for p in webhook_pods(kit)]
    assert any("claim configuration refused" in log for log in logs), logs


def test_a_rolling_restart_keeps_refusing(kit: Kit, routed: None) -> None:
    """maxUnavailable 0 and the readiness probe: while the Deployment rolls, every bad claim is
    still refused (none admitted because no pod answered)."""
    until(lambda: answer(kit, claim(BAD)), "the webhook's refusal", within=60)
    old = {p["metadata"]["name"] for p in webhook_pods(kit)}
    started = time.monotonic()
    kit.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{WEBHOOK}")
    outcomes = {"refused": 0, "admitted": 0}

    def rolled() -> bool:
        outcomes["refused" if answer(kit, claim(BAD)) else "admitted"] += 1
        pods: list[dict[str, Any]] = kit.get("pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]
        names = {p["metadata"]["name"] for p in pods}
        ready = [p for p in pods
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]  # fmt: skip
        return not names & old and len(ready) == 2

    until(rolled, "the webhook Deployment to roll to two new pods", within=240, every=0)
    kit.timings["webhook: rollout restart -> two new pods Ready, old ones gone"] = round(
        time.monotonic() - started, 1
    )
    kit.notes.append(f"webhook rolling restart: bad claims sent while it rolled: {outcomes}")
    assert outcomes["admitted"] == 0, outcomes
    assert outcomes["refused"] >= 5, outcomes
