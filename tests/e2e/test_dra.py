"""A claim's whole life through DRA on the real cluster, the host as a process on the node.

The example backend is served through DRA only. The tests run in file order and build on each
other: the widgets appear as a ResourceSlice; a pod with a claim from a ResourceClaimTemplate of
the example DeviceClass is scheduled and the kubelet calls NodePrepareResources; a kubelet
restart and a host restart leave the claim prepared; a reboot (the CDI dir emptied, the kubelet
started again) finds the claim's CDI spec written again before the driver registers; deleting the pod makes the kubelet call
NodeUnprepareResources, which releases the widget; the host stopping withdraws the slice.
Beside it the host serves the gizmo fixture backend through DRA with gizmo-1 unhealthy: with the
kit's gates on 1.34 and 1.35 (DRADeviceTaints off, the API server drops device taints) gizmo-1 is
withdrawn, not tainted, and the host says so once; from 1.36 (the gate on by default) it stays
with the host's taint (tests/e2e/test_dra_taints.py turns the gate on where it is off).
Timings go to the session's report (kit.timings).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from drahost import DraHost, device_count, dra_config, driver_slices, printed_env
from k8skit import ClusterDra, Kit, until

from devicehost import cdi

REPO = Path(__file__).resolve().parents[2]
DRIVER = "example.com"
LABEL = {"devicehost-e2e": "dra"}
GIZMO_DRIVER = "gizmos.example.org"
WITHDRAWN = "unhealthy devices are withdrawn: the API server drops device taints (DRADeviceTaints off)"
TAINTED = "unhealthy devices stay published with a taint"
UNHEALTHY = "devicehost.io/unhealthy"
CLAIMS_FILE = Path("/var/lib/kubelet/plugins") / DRIVER / "devicehost-claims.json"


@pytest.fixture(scope="module")
def host(kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    tmp = tmp_path_factory.mktemp("dra-host")
    node = kit.node()["metadata"]["name"]
    backends: dict[str, dict[str, Any]] = {
        "example": {"resources": {"example.com/widget": 4}},
        "gizmo": {"count": 2, "unhealthy": ["gizmo-1"]},
    }
    config = dra_config(node, backends)
    kit.kubectl("apply", "-f", str(REPO / "deploy/components/dra/deviceclass.yaml"))
    started = DraHost.configured(tmp / "config.yaml", tmp / "host.log", config).start()
    try:
        yield started
    finally:  # pods first: the kubelet unprepares their claims through the host
        if started.running():
            kit.kubectl("delete", "pods", "-l", "devicehost-e2e=dra", "--ignore-not-found", "--wait=true")
        started.stop()
        kit.kubectl("delete", "pods", "-l", "devicehost-e2e=dra", "--ignore-not-found", "--wait=true")
        kit.kubectl("delete", "resourceclaimtemplate", "one-widget", "--ignore-not-found")
        kit.kubectl("delete", "deviceclass", "widget.example.com", "--ignore-not-found")


def slices(kit: Kit) -> list[dict[str, Any]]:
    return driver_slices(kit, DRIVER)


def published(kit: Kit, count: int) -> bool:
    found = slices(kit)
    return len(found) == 1 and len(found[0]["spec"].get("devices", [])) == count


def claim_pod(name: str) -> list[dict[str, Any]]:
    """The example's ResourceClaimTemplate, and a pod of the kit's envsleep image that uses it."""
    template, pod = yaml.safe_load_all((REPO / "deploy/examples/dra/widget-pod.yaml").read_text())
    pod["metadata"] = {"name": name, "namespace": "default", "labels": LABEL}
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    (container,) = pod["spec"]["containers"]
    container.update(image="localhost/envsleep:v1", imagePullPolicy="Never")
    container.pop("command")
    return [template, pod]


def prepared_claims() -> dict[str, Any]:
    claims: dict[str, Any] = json.loads(CLAIMS_FILE.read_text())["claims"]
    return claims


def test_the_widgets_appear_as_a_resource_slice(kit: Kit, host: DraHost) -> None:
    started = time.monotonic()
    until(lambda: published(kit, 4), "a ResourceSlice of example.com with 4 devices", within=60)
    kit.timings["DRA: host start -> ResourceSlice published"] = round(time.monotonic() - started, 2)
    (found,) = slices(kit)
    assert found["spec"]["nodeName"] == kit.node()["metadata"]["name"]
    assert found["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert found["spec"]["devices"][0]["attributes"]["id"] == {"string": "widget-0"}
    assert until(lambda: host.events("registered with the kubelet"), "the kubelet registered the driver", 30)


def test_an_unhealthy_device_is_withdrawn_or_tainted_as_the_api_has_taints(
    kit: Kit, host: DraHost, dra_cluster: ClusterDra
) -> None:
    """DRADeviceTaints off (the kit's default on 1.34, 1.35): the gizmo its backend reports
    unhealthy is not published at all, and the host said why, once for the driver. On (1.36 and
    later by default): it stays published with the host's taint, and the host said that once."""
    until(lambda: device_count(kit, GIZMO_DRIVER) >= 1, f"a ResourceSlice of {GIZMO_DRIVER}", within=60)
    (found,) = driver_slices(kit, GIZMO_DRIVER)
    names = [d["name"] for d in found["spec"]["devices"]]
    if dra_cluster.version.enabled("DRADeviceTaints"):
        assert names == ["gizmo-0", "gizmo-1"], found["spec"]
        (tainted,) = [d for d in found["spec"]["devices"] if d.get("taints")]
        assert tainted["name"] == "gizmo-1"
        assert tainted["taints"][0]["key"] == UNHEALTHY, tainted
        said = [e for e in host.events(TAINTED) if e.get("driver") == GIZMO_DRIVER]
        assert len(said) == 1, said
        assert not host.events(WITHDRAWN)
        kit.notes.append(f"DRA (taints on by default in {dra_cluster.version.version}): gizmo-1 tainted")
        return
    assert names == ["gizmo-0"], found["spec"]
    assert all("taints" not in d for d in found["spec"]["devices"]), found["spec"]
    said = [e for e in host.events(WITHDRAWN) if e.get("driver") == GIZMO_DRIVER]
    assert len(said) == 1, said
    assert not host.events(TAINTED)
    kit.notes.append(f"DRA (taints off): {GIZMO_DRIVER} slice devices {[d['name'] for d in found['spec']['devices']]}; "
                     f"host said: {said[0]['event']}")  # fmt: skip


def test_a_pod_with_a_claim_runs_on_a_prepared_widget(kit: Kit, host: DraHost) -> None:
    started = time.monotonic()
    template, pod = claim_pod("widget-user")
    kit.apply(template)
    kit.run_pod(pod, within=120)
    kit.timings["DRA: pod created -> running"] = round(time.monotonic() - started, 2)
    (prepared,) = host.events("claim prepared")
    claim = kit.get("resourceclaims", "-n", "default")["items"][0]
    assert prepared["uid"] == claim["metadata"]["uid"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["device"]) == (DRIVER, prepared["devices"][0])
    assert list(prepared_claims()) == [claim["metadata"]["uid"]]
    # The claim's CDI spec sets EXAMPLE_WIDGETS; containerd 1.7 (CDI on) puts it in the container.
    env = printed_env(kit, "default", "widget-user", "app")
    shown = sorted(f"ENV {k}={v}" for k, v in env.items() if k.startswith("EXAMPLE_"))
    kit.notes.append(f"DRA: widget-user's container env: {' '.join(shown)}")
    assert env.get("EXAMPLE_WIDGETS") == prepared["devices"][0], shown


def test_a_kubelet_restart_leaves_the_claim_prepared(kit: Kit, host: DraHost) -> None:
    uid = next(iter(prepared_claims()))
    registered = len(host.events("registered with the kubelet"))
    kit.restart_kubelet()
    until(lambda: len(host.events("registered with the kubelet")) > registered, "registered again", 60)
    until(lambda: published(kit, 4), "the slice published again after the kubelet wiped it", within=60)
    assert list(prepared_claims()) == [uid]
    assert kit.get("pod", "widget-user")["status"]["phase"] == "Running"


def test_a_host_restart_keeps_the_claim(kit: Kit, host: DraHost) -> None:
    uid = next(iter(prepared_claims()))
    assert host.stop() == 0
    until(lambda: not slices(kit), "the slice withdrawn when the host stops", within=30)
    started = time.monotonic()
    host.start()
    until(lambda: published(kit, 4), "the slice back after the host restart", within=60)
    kit.timings["DRA: host restart -> ResourceSlice published"] = round(time.monotonic() - started, 2)
    assert until(lambda: host.events("prepared claims restored"), "the checkpoint read", 10)
    assert list(prepared_claims()) == [uid]


def test_a_reboot_writes_the_claims_spec_again_before_the_driver_registers(kit: Kit, host: DraHost) -> None:
    """A node reboot as the host meets it: ``/var/run/cdi`` is a tmpfs (emptied), the kubelet
    starts again, and the host starts with its checkpoint (under ``/var/lib/kubelet``, kept). The
    claim's CDI spec is on disk again, the same, before the kubelet registers the driver: a
    container (re)created for the claim's pod resolves it (kubernetes/kubernetes#141433)."""
    uid = next(iter(prepared_claims()))
    spec = cdi.spec_path(f"{DRIVER}/claim-{uid}", cdi.DEFAULT_CDI_DIR)
    before = json.loads(spec.read_text())
    assert host.stop() == 0
    spec.unlink()
    kit.restart_kubelet()
    registered = len(host.events("registered with the kubelet"))
    started = time.monotonic()
    host.start()
    until(lambda: len(host.events("registered with the kubelet")) > registered, "registered again", 60)
    kit.timings["DRA: reboot's host start -> driver registered"] = round(time.monotonic() - started, 2)
    log = host.log.read_text()
    restored_at = log.rfind('"prepared claims restored"')
    assert -1 < restored_at < log.rfind('"registered with the kubelet"'), "restored before registering"
    restored = host.events("prepared claims restored")[-1]
    assert restored["specs_written"] >= 1, restored
    assert json.loads(spec.read_text()) == before
    kit.notes.append(f"DRA reboot: {restored['event']} {restored}")
    assert list(prepared_claims()) == [uid]
    assert kit.get("pod", "widget-user")["status"]["phase"] == "Running"


def test_deleting_the_pod_unprepares_and_releases_the_widget(kit: Kit, host: DraHost) -> None:
    started = time.monotonic()
    kit.kubectl("delete", "pod", "widget-user", "--wait=true")
    (unprepared,) = until(lambda: host.events("claim unprepared"), "NodeUnprepareResources", within=60)
    kit.timings["DRA: pod deleted -> claim unprepared"] = round(time.monotonic() - started, 2)
    assert prepared_claims() == {}
    (prepared,) = host.events("claim prepared")
    assert unprepared["uid"] == prepared["uid"]
    widget = prepared["devices"][0]
    assert until(
        lambda: f"scrubbed example.com/widget widgets {widget}" in host.log.read_text(),
        "the example backend's release hook scrubbing the widget",
        within=10,
    )


def test_a_stopped_host_withdraws_the_slice(kit: Kit, host: DraHost) -> None:
    assert host.stop() == 0
    until(lambda: not slices(kit), "no ResourceSlice of example.com", within=30)
    assert not list(Path("/var/lib/kubelet/plugins_registry").glob("devicehost-example.com-*.sock"))
