"""What a scenario's pods were allocated, on the real cluster and on the stand-in, in one shape.

A scenario is a manifest of tests/e2e/manifests: its pods name ResourceClaims or templates. Its
allocation is, by pod, each of the pod's claim entries with the (request, device) of every
result: ``{"pod0": {"gpu": [["gpu", "gpu-0"]]}}``. :func:`observed` reads it from the cluster
(the e2e suite), :func:`scheduled` makes it on the stand-in API server (the stand-in's scenario
tests), and :func:`record` (:func:`record_refusal`: a FailedScheduling message) keeps what the
cluster did: in the session's notes and, when
``DEVICEHOST_E2E_ALLOCATIONS`` names a file, as a JSON line there that :func:`recorded` reads
back, so the stand-in's tests compare against the real cluster's last run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from devicehost.standin.apiserver import ApiServerStandIn

Pods = dict[str, dict[str, list[list[str]]]]
RECORD = "DEVICEHOST_E2E_ALLOCATIONS"
MANIFESTS = Path(__file__).resolve().parents[1] / "e2e" / "manifests"


class Manifest:
    """A scenario's documents, by kind and name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.docs = [d for d in yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text()) if d]

    def of(self, kind: str) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in self.docs if d["kind"] == kind}

    @property
    def namespace(self) -> str:
        (name,) = self.of("Namespace")
        return name


def _claim_entries(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"].get("resourceClaims", ()))


def scheduled(cluster: ApiServerStandIn, manifest: Manifest, pod: str) -> dict[str, list[list[str]]]:
    """Allocate the pod's claims on the stand-in as the scheduler places the pod: those not yet
    allocated together (a template's claim as ``<pod>-<entry>``, a named claim once for all its
    pods); what each entry got.

    :raises Unschedulable: the claims cannot be allocated (none is).
    """
    namespace, names, new = manifest.namespace, {}, []
    for entry in _claim_entries(manifest.of("Pod")[pod]):
        if "resourceClaimName" in entry:
            name = entry["resourceClaimName"]
            spec = manifest.of("ResourceClaim")[name]["spec"]
        else:
            name = f"{pod}-{entry['name']}"
            spec = manifest.of("ResourceClaimTemplate")[entry["resourceClaimTemplateName"]]["spec"]["spec"]
        names[entry["name"]] = name
        if (namespace, name) not in cluster.claims:
            new.append((name, spec))
    cluster.allocate_claims(new, namespace=namespace)
    return {
        entry: [[d.request, d.device] for d in cluster.claims[(namespace, name)].devices]
        for entry, name in names.items()
    }


def release(cluster: ApiServerStandIn, manifest: Manifest, pod: str) -> None:
    """The pod deleted: its template claims go (a named claim stays, as on the cluster)."""
    for entry in _claim_entries(manifest.of("Pod")[pod]):
        if "resourceClaimTemplateName" in entry:
            cluster.claims.pop((manifest.namespace, f"{pod}-{entry['name']}"), None)


def observed(kit: Any, namespace: str, pods: list[str], driver: str) -> Pods:
    """What the cluster allocated to each of ``pods``' claims (results of ``driver``)."""
    found: Pods = {}
    for pod in pods:
        body = kit.get("pod", "-n", namespace, pod)
        names = {s["name"]: s["resourceClaimName"] for s in body["status"].get("resourceClaimStatuses", ())}
        names |= {c["name"]: c["resourceClaimName"] for c in _claim_entries(body) if "resourceClaimName" in c}
        found[pod] = {}
        for entry, claim in names.items():
            results = kit.get("resourceclaim", "-n", namespace, claim)["status"]["allocation"]["devices"][
                "results"
            ]
            found[pod][entry] = [[r["request"], r["device"]] for r in results if r["driver"] == driver]
    return found


def record(kit: Any, scenario: str, pods: Pods) -> None:
    """Keep what the cluster allocated in ``scenario``: in the notes, and in the record file."""
    kit.notes.append(f"allocation {scenario}: {json.dumps(pods, sort_keys=True)}")
    _write({"scenario": scenario, "pods": pods})


def record_refusal(kit: Any, scenario: str, pod: str, message: str) -> None:
    """Keep the scheduler's FailedScheduling message for ``pod`` in ``scenario``."""
    kit.notes.append(f"refusal {scenario} {pod}: {message}")
    _write({"scenario": scenario, "refused": {pod: message}})


def _write(line: dict[str, Any]) -> None:
    path = os.environ.get(RECORD)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(line, sort_keys=True) + "\n")


def recorded(scenario: str, what: str = "pods") -> list[Any]:
    """What the real cluster allocated (``what`` "refused": refused, by pod) in ``scenario`` in
    the run the record file holds, in order."""
    path = os.environ.get(RECORD)
    if not path or not Path(path).exists():
        return []
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [line[what] for line in lines if line["scenario"] == scenario and what in line]
