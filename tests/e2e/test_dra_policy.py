"""deploy/components/dra on the real cluster: the host's ServiceAccount writes only its own node's
ResourceSlices.

The component's ServiceAccount, ClusterRole, binding and ValidatingAdmissionPolicy are applied as
``kubectl kustomize`` renders them; a pod of that ServiceAccount runs on the node, and a token
bound to it (as the kubelet projects one into the DaemonSet's pod, with the node's name in it)
is used to create, replace and delete slices: its own node's pass, another node's are refused
with the policy's message, and so is a token bound to no pod. The same token writes the
status.devices of a claim allocated on its node (on 1.36 and later the API server also asks for
``resourceclaims/driver`` ``associated-node:update``, which the ClusterRole grants), and is refused
for a claim allocated on another node and for a change of a claim's reservedFor. Nothing of the
host runs here.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8skit import Kit, pod_manifest, until
from overlays import write_own_overlay

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "kube-system"
ACCOUNT = "devicehost"
POD = "devicehost-token-holder"
SERVER = "https://127.0.0.1:6443"
CA = "/var/lib/k8s-kit/pki/ca.crt"
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
         "ValidatingAdmissionPolicyBinding"}  # fmt: skip


def component_objects(kit: Kit) -> list[dict[str, Any]]:
    """The API-access part of the example overlay with components/dra, as ``kubectl kustomize``
    renders a user's own overlay (relative paths: kustomize refuses absolute ones)."""
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        write_own_overlay(scratch, "example", ["dra"])
        rendered = kit.kubectl("kustomize", str(scratch))
    return [o for o in yaml.safe_load_all(rendered) if o and o["kind"] in KINDS]


def slice_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"devicehost-e2e": "policy"}},
        "spec": {
            "driver": "policy.example.com",
            "nodeName": node,
            "pool": {"name": f"{node}/policy", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}],
        },
    }


def touched(kit: Kit, name: str) -> str:
    """The slice as stored, with a label added: a replace (update, the verb the host uses)."""
    body = kit.get("resourceslice", name)
    body["metadata"].setdefault("labels", {})["touched"] = "yes"
    return json.dumps(body)


def put(name: str) -> tuple[str, ...]:
    """kubectl arguments for a plain PUT of the slice ``name`` (the host's replace; no patch)."""
    return ("replace", "--raw", f"/apis/resource.k8s.io/v1/resourceslices/{name}", "-f", "-")


def as_token(kit: Kit, token: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with only ``token`` for credentials (no admin kubeconfig)."""
    env = kit.env()
    env.pop("KUBECONFIG")
    return subprocess.run(
        ["kubectl", f"--server={SERVER}", f"--certificate-authority={CA}", f"--token={token}", *args],
        input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def objects(kit: Kit) -> Iterator[list[dict[str, Any]]]:
    found = component_objects(kit)
    assert {o["kind"] for o in found} == KINDS
    for obj in found:
        kit.apply(obj)
    yield found
    kit.kubectl("delete", "resourceslices", "-l", "devicehost-e2e=policy", "--ignore-not-found")
    kit.kubectl("-n", NAMESPACE, "delete", "pod", POD, "--ignore-not-found", "--wait=true")
    for obj in reversed(found):
        if obj["kind"] != "ServiceAccount":  # the DaemonSet tests use it too
            kit.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")


@pytest.fixture(scope="module")
def node_token(kit: Kit, objects: list[dict[str, Any]]) -> str:
    """A token of the ServiceAccount bound to a pod running on the node, as the DaemonSet's pod gets."""
    pod = pod_manifest(POD, "localhost/envsleep:v1", {"devicehost-e2e": "policy"}, serviceAccountName=ACCOUNT)
    pod["metadata"]["namespace"] = NAMESPACE
    kit.apply(pod)
    until(
        lambda: kit.get("-n", NAMESPACE, "pod", POD)["status"].get("phase") == "Running",
        f"pod {POD} running",
        within=90,
    )
    uid = kit.get("-n", NAMESPACE, "pod", POD)["metadata"]["uid"]
    return kit.kubectl(
        "-n", NAMESPACE, "create", "token", ACCOUNT,
        "--bound-object-kind", "Pod", "--bound-object-name", POD, "--bound-object-uid", uid,
    ).strip()  # fmt: skip


def test_the_token_carries_the_node(kit: Kit, node_token: str) -> None:
    review = json.loads(as_token(kit, node_token, "auth", "whoami", "-o", "json").stdout)
    extra = review["status"]["userInfo"].get("extra", {})
    assert extra.get("authentication.kubernetes.io/node-name") == [kit.node()["metadata"]["name"]]


def test_own_node_slices_are_written_and_another_nodes_are_refused(kit: Kit, node_token: str) -> None:
    node = kit.node()["metadata"]["name"]
    own = as_token(kit, node_token, "create", "-f", "-", stdin=json.dumps(slice_body("policy-own", node)))
    assert own.returncode == 0, own.stderr
    replaced = as_token(kit, node_token, *put("policy-own"), stdin=touched(kit, "policy-own"))
    assert replaced.returncode == 0, replaced.stderr

    other = as_token(
        kit, node_token, "create", "-f", "-", stdin=json.dumps(slice_body("policy-other", "other-node"))
    )
    assert other.returncode != 0
    assert f"devicehost on node '{node}' may not write ResourceSlices of node 'other-node'" in other.stderr
    kit.notes.append(f"policy: a slice of another node refused: {other.stderr.strip()}")

    kit.kubectl("create", "-f", "-", stdin=json.dumps(slice_body("policy-foreign", "other-node")))
    refused_update = as_token(kit, node_token, *put("policy-foreign"), stdin=touched(kit, "policy-foreign"))
    refused_delete = as_token(kit, node_token, "delete", "resourceslice", "policy-foreign")
    for verb, refused in (("update", refused_update), ("delete", refused_delete)):
        assert refused.returncode != 0, f"{verb} of another node's slice went through"
        assert "may not write ResourceSlices of node 'other-node'" in refused.stderr
    deleted = as_token(kit, node_token, "delete", "resourceslice", "policy-own")
    assert deleted.returncode == 0, deleted.stderr
    until(
        lambda: "policy-foreign" in kit.kubectl("get", "resourceslices", "-o", "name"),
        "the foreign slice to stay",
    )


def test_a_token_bound_to_no_pod_writes_no_slice(kit: Kit, objects: list[dict[str, Any]]) -> None:
    token = kit.kubectl("-n", NAMESPACE, "create", "token", ACCOUNT).strip()
    node = kit.node()["metadata"]["name"]
    refused = as_token(kit, token, "create", "-f", "-", stdin=json.dumps(slice_body("policy-unbound", node)))
    assert refused.returncode != 0
    assert "only with a token of a pod on a node" in refused.stderr


def claim_status_path(name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}/status"


def allocated_claim(kit: Kit, name: str, node: str) -> dict[str, Any]:
    """A claim the scheduler allocated device d0 of ``node``'s pool to (written as the admin)."""
    kit.apply({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "labels": {"devicehost-e2e": "policy"}},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "policy.example.com"}}]}},
    })  # fmt: skip
    claim = kit.get("resourceclaim", "-n", "default", name)
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "r", "driver": "policy.example.com", "pool": f"{node}/policy", "device": "d0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
    }  # fmt: skip
    kit.kubectl("replace", "--raw", claim_status_path(name), "-f", "-", stdin=json.dumps(claim))
    return kit.get("resourceclaim", "-n", "default", name)


def with_device_status(claim: dict[str, Any]) -> str:
    """The claim with a status.devices entry for its device, as the host writes it."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    entry = {k: result[k] for k in ("driver", "pool", "device")} | {"data": {"ready": "yes"}}
    return json.dumps({**claim, "status": {**claim["status"], "devices": [entry]}})


def test_claim_status_is_written_only_for_claims_on_its_node_and_only_status_devices(
    kit: Kit, node_token: str
) -> None:
    node = kit.node()["metadata"]["name"]
    try:
        own, other = (
            allocated_claim(kit, "policy-own-claim", node),
            allocated_claim(kit, "policy-other-claim", "other-node"),
        )
        written = as_token(kit, node_token, "replace", "--raw", claim_status_path("policy-own-claim"), "-f", "-",
                           stdin=with_device_status(own))  # fmt: skip
        assert written.returncode == 0, written.stderr
        stored = kit.get("resourceclaim", "-n", "default", "policy-own-claim")["status"]["devices"]
        assert stored[0]["data"] == {"ready": "yes"}, stored

        refused = as_token(kit, node_token, "replace", "--raw", claim_status_path("policy-other-claim"), "-f", "-",
                           stdin=with_device_status(other))  # fmt: skip
        assert refused.returncode != 0
        assert (
            f"devicehost on node '{node}' may not write the status of a ResourceClaim not allocated on it"
            in (refused.stderr)
        )
        kit.notes.append(f"policy: another node's claim status refused: {refused.stderr.strip()}")

        again = kit.get("resourceclaim", "-n", "default", "policy-own-claim")
        # reserving the claim for a pod is the scheduler's (moving the allocation the API refuses itself)
        again["status"]["reservedFor"] = [
            {"resource": "pods", "name": "intruder", "uid": "0f0f0f0f-0000-4000-8000-000000000001"}
        ]
        tampered = as_token(kit, node_token, "replace", "--raw", claim_status_path("policy-own-claim"), "-f", "-",
                            stdin=json.dumps(again))  # fmt: skip
        assert tampered.returncode != 0
        assert "may write a ResourceClaim's status.devices only" in tampered.stderr
    finally:
        kit.kubectl(
            "delete", "resourceclaims", "-n", "default", "-l", "devicehost-e2e=policy", "--ignore-not-found"
        )
