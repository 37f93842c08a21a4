"""``devicehost webhook`` on the kit's real API server.

The kit's API server has no kube-proxy: a Service's ClusterIP is not reachable from it, so the
webhook runs as a process on the node (as the host does in test_dra_example.py) and the
ValidatingWebhookConfiguration reaches it by ``clientConfig.url``
(``https://127.0.0.1:<port>/validate-resource-claim``), with a certificate for 127.0.0.1 from
``devicehost webhook-cert --ip-address 127.0.0.1``. The Deployment/Service of
deploy/components/webhook are checked offline in tests/test_webhook.py.

Every claim goes in with ``kubectl apply --dry-run=server``: admission runs (the webhook says
``sideEffects: None``), nothing is stored, nothing is left behind. Needs the dra-example
backend installed beside this Python (as test_dra_example.py does) and the `cryptography`
package (devicehost[webhook-cert]).
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpuclaims import BAD, DENIED, DRIVER, GOOD, KEY_PATH, MODEL_WORDS, claim, template
from k8skit import Kit, until
from probing import free_port

pytest.importorskip("cryptography")
pytest.importorskip("devicehost_dra_example")

DEVICEHOST = str(Path(sys.executable).parent / "devicehost")
NAME = "devicehost-e2e-claim-config"


class WebhookProcess:
    """``devicehost webhook --backend dra-example`` on 127.0.0.1, its certificate and log."""

    def __init__(self, workdir: Path) -> None:
        self.certs = workdir / "certs"
        done = subprocess.run(
            [DEVICEHOST, "webhook-cert", "--out-dir", str(self.certs), "--no-service-names",
             "--ip-address", "127.0.0.1"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.ca_bundle = done.stdout.strip()
        self.port = free_port()
        self.log = workdir / "webhook.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [DEVICEHOST, "webhook", "--backend", "dra-example", "--log-format", "json",
                 "--listen-address", f"127.0.0.1:{self.port}",
                 "--tls-cert", str(self.certs / "tls.crt"), "--tls-key", str(self.certs / "tls.key")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/readyz", context=context) as r:
                    return bool(json.loads(r.read())["drivers"].get(DRIVER) == "dra-example")
            except OSError:
                return False

        until(ready, "the webhook to know gpu.example.com", within=60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        self.process = None


def configuration(webhook: WebhookProcess, failure_policy: str, versions: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [
            {
                "name": "claim-config.devicehost.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{webhook.port}/validate-resource-claim",
                    "caBundle": webhook.ca_bundle,
                },
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": versions,
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": failure_policy,
                "timeoutSeconds": 5,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }


def served_versions(kit: Kit) -> list[str]:
    groups = kit.kubectl("api-versions").split()
    return [v for v in ("v1", "v1beta2", "v1beta1") if f"resource.k8s.io/{v}" in groups]


def dry_run(kit: Kit, obj: dict[str, Any]) -> str:
    """``kubectl apply --dry-run=server``: the API server's answer, admission included."""
    return kit.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))


def refused(kit: Kit, obj: dict[str, Any], what: str) -> str:
    """kubectl's refusal of ``obj`` (its stderr line goes to the session's report as ``what``)."""
    with pytest.raises(AssertionError) as failed:
        dry_run(kit, obj)
    said = [ln for ln in str(failed.value).splitlines()[1:] if ln.strip()]  # below "kubectl ... exited 1:"
    kit.notes.append(f"webhook {what}: {' '.join(said)}")
    return str(failed.value)


@pytest.fixture(scope="module")
def webhook(kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    running = WebhookProcess(tmp_path_factory.mktemp("webhook"))
    running.start()
    kit.apply(configuration(running, "Ignore", served_versions(kit)))
    try:
        yield running
    finally:
        kit.kubectl("delete", "validatingwebhookconfiguration", NAME, "--ignore-not-found")
        running.stop()


def _settle() -> None:
    time.sleep(2)  # the API server picks up a new webhook configuration within a second or so


def test_an_invalid_claim_is_refused_with_the_models_message(kit: Kit, webhook: WebhookProcess) -> None:
    _settle()
    message = refused(kit, claim(BAD), "invalid v1 claim refused")
    assert DENIED in message
    assert f"{KEY_PATH}: {MODEL_WORDS}" in message


def test_a_valid_claim_a_claim_for_another_driver_and_one_without_config_are_admitted(
    kit: Kit, webhook: WebhookProcess
) -> None:
    dry_run(kit, claim(GOOD))
    dry_run(kit, claim({"whatever": True}, driver="gpu.other.example.com"))
    dry_run(kit, claim(None))


def test_an_invalid_template_is_refused_at_spec_spec(kit: Kit, webhook: WebhookProcess) -> None:
    assert f"spec.{KEY_PATH}" in refused(kit, template(BAD), "invalid template refused")


def test_an_invalid_v1beta1_claim_is_refused_where_v1beta1_is_served(
    kit: Kit, webhook: WebhookProcess
) -> None:
    if "v1beta1" not in served_versions(kit):
        pytest.skip("this API server does not serve resource.k8s.io/v1beta1")
    assert KEY_PATH in refused(kit, claim(BAD, version="v1beta1"), "invalid v1beta1 claim refused")


def test_with_the_webhook_down_ignore_admits_and_fail_refuses(kit: Kit, webhook: WebhookProcess) -> None:
    webhook.stop()
    try:
        started = time.monotonic()
        dry_run(kit, claim(BAD))  # failurePolicy Ignore: admitted unchecked
        assert time.monotonic() - started < 10
        kit.apply(configuration(webhook, "Fail", served_versions(kit)))
        _settle()
        # Fail: even a good claim is refused while it is down
        message = refused(kit, claim(GOOD), "good claim, webhook down, failurePolicy Fail")
        assert "failed calling webhook" in message
    finally:
        kit.apply(configuration(webhook, "Ignore", served_versions(kit)))
        webhook.start()
