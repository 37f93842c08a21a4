"""The way operators and vendors deploy: the Dockerfile built with buildah, the overlays applied.

Both images are built from the repository's own Dockerfile on the kit's plain Debian Python base
(``python3`` 3.11 in a venv, PEP 668), offline (``PIP_NO_INDEX=1``) from a wheelhouse built from
this checkout. The example image holds a bundled backend (``BACKENDS=devicehost-example``); the
vendor image holds an out-of-tree backend given as a wheel file in the build context, deployed
with a copy of the example overlay, as deploy/README.md tells vendors to. The vendor overlay
replaces the example DaemonSet in place: the rolling update the base's strategy promises.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8skit import Kit, pod_manifest, until

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "kube-system"
SELECTOR = "app.kubernetes.io/name=devicehost"
OFFLINE_BUILD = ("--build-arg", "PYTHON_VERSION=3.11", "--build-arg", "PIP_NO_INDEX=1")


def write_kustomization(directory: Path, content: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(content, sort_keys=False))


def host_pods(kit: Kit) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kit.get("pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]
    return pods


def rolled_out(kit: Kit, what: str) -> dict[str, Any]:
    """Wait until the DaemonSet's pod runs the current template and is Ready by its own probes."""
    started = time.monotonic()
    kit.kubectl("-n", NAMESPACE, "rollout", "status", "daemonset/devicehost", "--timeout=180s", timeout=200)
    kit.timings[f"{what}: apply -> DaemonSet pod Ready"] = round(time.monotonic() - started, 1)
    pods = [p for p in host_pods(kit) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod = pods[0]
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True", pod["status"]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, "the liveness probe restarted it"
    events = kit.get(
        "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={pod['metadata']['name']}"
    )
    probe_failures = [e["message"] for e in events["items"] if e["reason"] == "Unhealthy"]
    kit.notes.append(f"{what}: pod {pod['metadata']['name']} probe failures before Ready: {probe_failures}")
    return pod


def consumer(kit: Kit, name: str, image: str, resource: str, env: str) -> str:
    """Run a pod asking for one device of ``resource``; the value of ``env`` inside it."""
    labels = {"devicehost-e2e": "image"}
    limits = {"command": ["sleep", "3600"], "resources": {"limits": {resource: 1}}}
    kit.run_pod(pod_manifest(name, image, labels, container=limits))
    return kit.kubectl("exec", name, "--", "sh", "-c", f'printf %s "${env}"')


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("overlays")


def test_example_image_from_the_dockerfile_serves_widgets_through_the_overlay(
    kit: Kit, python_base: str, image_context: Path, overlays: Path
) -> None:
    tag = "localhost/devicehost:e2e-example"
    kit.build_image(tag, image_context, "--build-arg", f"BASE_IMAGE={python_base}", *OFFLINE_BUILD,
                    "--build-arg", "BACKENDS=devicehost-example")  # fmt: skip
    # The operator's way: the overlay as shipped, its image replaced (kustomize images:).
    mine = overlays / "example"
    write_kustomization(
        mine,
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / "overlays" / "example", mine)],
            "images": [{"name": "devicehost", "newName": tag.split(":")[0], "newTag": tag.split(":")[1]}],
        },
    )
    kit.kubectl("apply", "-k", str(mine))
    pod = rolled_out(kit, "example overlay")
    # Device release works in the deployed host: the kubelet's pod-resources dir is mounted,
    # read-only, at the path the host dials (issue 26: it was paused in every deployed host).
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    kit.wait_resource("example.com/widget", 4, 4)
    host = pod["metadata"]["name"]
    until(
        lambda: "device release on" in kit.logs("-n", NAMESPACE, host), "the host's 'device release on' line"
    )
    assert "device release paused" not in kit.logs("-n", NAMESPACE, host)
    widget = consumer(kit, "widget-from-daemonset", python_base, "example.com/widget", "EXAMPLE_WIDGETS")
    assert widget in {f"widget-{n}" for n in range(4)}
    deleted = time.monotonic()
    kit.kubectl("delete", "pod", "widget-from-daemonset", "--wait=true")
    released = until(
        lambda: next(
            (line for line in kit.logs("-n", NAMESPACE, host).splitlines()
             if '"devices released"' in line and widget in line),
            None,
        ),
        f"the DaemonSet's host to release {widget}",
        within=90,
    )  # fmt: skip
    kit.timings["DaemonSet: pod deleted -> device released"] = round(time.monotonic() - deleted, 1)
    kit.notes.append(f"DaemonSet release: {released}")


def vendor_overlay(directory: Path, image: str) -> None:
    """deploy/README.md's vendor recipe: copy the example overlay, point it at the base, set the
    config's backend part and the image."""
    shutil.copytree(DEPLOY / "overlays" / "example", directory)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    kustomization["resources"] = [os.path.relpath(DEPLOY / "base", directory)]
    kustomization["images"] = [
        {"name": "devicehost", "newName": image.split(":")[0], "newTag": image.split(":")[1]}
    ]
    write_kustomization(directory, kustomization)
    config = yaml.safe_load((directory / "config.yaml").read_text())
    config["enabled_backends"] = ["gizmo"]
    config["backends"] = {"gizmo": {"count": 3}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


def test_out_of_tree_backend_wheel_image_replaces_the_example_in_a_rolling_update(
    kit: Kit, python_base: str, image_context: Path, overlays: Path
) -> None:
    tag = "localhost/devicehost-gizmo:e2e"
    wheels = sorted((image_context / "wheels").glob("devicehost_gizmo-*.whl"))
    assert len(wheels) == 1, wheels
    kit.build_image(tag, image_context, "--build-arg", f"BASE_IMAGE={python_base}", *OFFLINE_BUILD,
                    "--build-arg", f"BACKENDS=wheels/{wheels[0].name}")  # fmt: skip
    old = {p["metadata"]["name"] for p in host_pods(kit)}
    log_offset = kit.kubelet_log_offset()
    vendor_overlay(overlays / "gizmo", tag)
    kit.kubectl("apply", "-k", str(overlays / "gizmo"))
    until(lambda: {p["metadata"]["name"] for p in host_pods(kit)} - old, "a new DaemonSet pod", within=60)
    pod = rolled_out(kit, "vendor overlay (rolling update from example)")
    assert pod["metadata"]["name"] not in old
    assert pod["spec"]["containers"][0]["image"] == tag
    kit.wait_resource("gizmos.example.org/gizmo", 3, 3)
    # The example backend is no longer served: its devices stop counting.
    kit.wait_resource("example.com/widget", None, 0)
    gizmo = consumer(kit, "gizmo-from-daemonset", python_base, "gizmos.example.org/gizmo", "GIZMOS")
    assert gizmo in {f"gizmo-{n}" for n in range(3)}
    kit.notes.append("kubelet, rolling update example -> vendor:\n" + "\n".join(kit.kubelet_log(log_offset)))
