"""1,000 devices on one node through DRA on the real cluster (issue 25 items 1 and 6).

A host serves the gizmo fixture backend with 1,000 gizmos through DRA (driver
gizmos.example.org), as a process on the kit's node started from a config file. They are
published as one pool, ``<node>/gizmo``, of ceil(1000 / 128) = 8 ResourceSlices (where the API
server keeps device taints, by default from 1.36, a slice of devices that may be tainted holds at
most 64: ceil(1000 / 64) = 16), each with the pool's generation and ``resourceSliceCount``; the
time from the host's start to the API server listing them all (and the host's own first-to-last
write) goes to ``kit.timings`` and out. A pod
whose claim selects the last gizmo by CEL runs and its container saw ``GIZMOS=gizmo-999``.

Then one gizmo flaps: the config file is rewritten with it unhealthy, then healthy, every 100 ms
for a few seconds, each time with SIGHUP (the host re-reads it and rediscovers). The host
publishes a pool at most once a second: the writes it logged, and the updates a
``kubectl get --watch`` of the gizmo's slice saw, are counted in the window and reported as writes
a second; the slice must end at the gizmo's last health. No feature gate: without
DRADeviceTaints the host withdraws an unhealthy gizmo from its slice, with it (1.36 on) it taints
it (a write all the same).
"""

from __future__ import annotations

import itertools
import math
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from drahost import DraHost, claim_pod, dra_config, driver_slices, pods, printed_env, since, wait_running
from k8skit import ClusterDra, Kit, until

from devicehost.host.dra.slices import MAX_CONSUMING_DEVICES, MAX_DEVICES

DRIVER = "gizmos.example.org"
CLASS_NAME = "gizmo.gizmos.example.org"
GIZMOS = 1000


def slice_sizes(dra: ClusterDra) -> list[int]:
    """The devices of each slice the host lays the gizmos out in, smallest first: 128 a slice, 64
    where the API server keeps device taints (1.36 on by default)."""
    per = MAX_CONSUMING_DEVICES if dra.version.enabled("DRADeviceTaints") else MAX_DEVICES
    return sorted([per] * (GIZMOS // per) + ([GIZMOS % per] if GIZMOS % per else []))


LABEL = {"devicehost-e2e": "dra-pools"}
NAMESPACE = "dra-pools"
FLAPPING = "gizmo-600"
"""In the 5th slice (gizmos 512 to 639)."""
FLAP_PERIOD = 0.1
FLAP_SECONDS = 6.0


def note(kit: Kit, text: str) -> None:
    kit.notes.append(f"dra-pools {text}")
    print(text)


def config(node: str, unhealthy: list[str]) -> dict[str, Any]:
    return dra_config(node, {"gizmo": {"count": GIZMOS, "unhealthy": unhealthy}})


def pool_name(kit: Kit) -> str:
    return f"{kit.node()['metadata']['name']}/gizmo"


def published(kit: Kit, devices: int, count: int) -> list[dict[str, Any]] | None:
    """The driver's slices once they are one whole pool of ``devices`` devices in ``count``
    slices, else None."""
    slices = driver_slices(kit, DRIVER)
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    total = sum(len(s["spec"].get("devices", [])) for s in slices)
    return slices if len(slices) == count and len(pools) == 1 and total == devices else None


def written_at(host: DraHost, event: str) -> list[float]:
    """When the host logged each ``event`` (its ISO timestamps), in seconds since the epoch."""
    return [datetime.fromisoformat(e["timestamp"]).timestamp() for e in host.events(event)]


@pytest.fixture(scope="module")
def host(kit: Kit, dra_cluster: ClusterDra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraHost]:
    node = kit.node()["metadata"]["name"]
    count = len(slice_sizes(dra_cluster))
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS_NAME, "labels": LABEL},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    kit.apply(device_class)
    kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
    tmp = tmp_path_factory.mktemp("dra-pools")
    started = time.monotonic()
    gizmos = DraHost.configured(tmp / "config.yaml", tmp / "host.log", config(node, [])).start()
    try:
        gizmos.ready(lambda: published(kit, GIZMOS, count), f"{GIZMOS} gizmos in {count} slices of one pool")
        kit.timings[f"dra-pools: host start -> {GIZMOS} gizmos listed in {count} slices"] = since(started)
        yield gizmos
    finally:
        if gizmos.running():
            kit.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=180)
        gizmos.stop()
        kit.kubectl("delete", "deviceclass", CLASS_NAME, "--ignore-not-found")
        gizmos.finish(kit, "dra-pools")


def test_a_thousand_devices_are_one_pool_and_the_last_one_allocates(
    kit: Kit, host: DraHost, dra_cluster: ClusterDra
) -> None:
    sizes = slice_sizes(dra_cluster)
    count = len(sizes)
    slices = published(kit, GIZMOS, count)
    assert slices is not None
    pools = [s["spec"]["pool"] for s in slices]
    assert {p["name"] for p in pools} == {pool_name(kit)}
    assert {p["resourceSliceCount"] for p in pools} == {count}
    assert len({p["generation"] for p in pools}) == 1
    assert sorted(len(s["spec"]["devices"]) for s in slices) == sizes  # 104 + 7 x 128, or 40 + 15 x 64
    writes = written_at(host, "ResourceSlice published")
    assert len(writes) == count  # one create each, nothing rewritten
    publish = round(writes[-1] - writes[0], 3)
    kit.timings[f"dra-pools: host's first to last of {count} slice writes"] = publish
    note(kit, f"{GIZMOS} gizmos: {count} slices of pool {pools[0]}, written in {publish} s by the host")

    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": NAMESPACE, "name": "last-gizmo"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gizmo",
                        "exactly": {
                            "deviceClassName": CLASS_NAME,
                            "selectors": [
                                {"cel": {"expression": f'device.attributes["{DRIVER}"].id == "gizmo-999"'}}
                            ],
                        },
                    }
                ]
            }
        },
    }
    pod = claim_pod(NAMESPACE, "pod0", {"name": "gizmo", "resourceClaimName": "last-gizmo"}, LABEL)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": LABEL}}
    started = time.monotonic()
    kit.apply_all([namespace, claim, pod])
    wait_running(kit, NAMESPACE, ["pod0"])
    kit.timings["dra-pools: pod on gizmo-999 applied -> running"] = since(started)
    env = printed_env(kit, NAMESPACE, "pod0", "ctr0")
    note(kit, f"{NAMESPACE} pod0/ctr0: GIZMOS={env.get('GIZMOS')}")
    assert env.get("GIZMOS") == "gizmo-999", env
    results = kit.get("resourceclaim", "-n", NAMESPACE, "last-gizmo")["status"]["allocation"]["devices"][
        "results"
    ]
    assert [(r["pool"], r["device"]) for r in results] == [(pool_name(kit), "gizmo-999")]
    assert pods(kit, NAMESPACE)["pod0"]["status"]["phase"] == "Running"
    kit.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=180)


def flapping_tainted(kit: Kit) -> bool:
    """Whether the flapping gizmo is published with a taint."""
    devices = [d for s in driver_slices(kit, DRIVER) for d in s["spec"]["devices"] if d["name"] == FLAPPING]
    return bool(devices and devices[0].get("taints"))


def test_a_flapping_device_costs_its_slice_at_most_one_write_a_second(
    kit: Kit, host: DraHost, dra_cluster: ClusterDra, tmp_path: Path
) -> None:
    node = kit.node()["metadata"]["name"]
    count, tainting = len(slice_sizes(dra_cluster)), dra_cluster.version.enabled("DRADeviceTaints")
    (flapping,) = [
        s for s in driver_slices(kit, DRIVER) if FLAPPING in {d["name"] for d in s["spec"]["devices"]}
    ]
    name = flapping["metadata"]["name"]
    before, changed_before = len(host.events("ResourceSlice updated")), len(host.events("devices changed"))
    watched = tmp_path / "watch.jsonl"
    with watched.open("w") as out:
        watch = subprocess.Popen(
            ["kubectl", "get", "resourceslice", name, "--watch-only", "--output-watch-events", "-o", "json"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=kit.env(),
        )
    try:
        time.sleep(1.0)  # the watch is up
        started, reloads = time.time(), 0
        while time.time() < started + FLAP_SECONDS:
            reloads += 1
            host.reload(config(node, [FLAPPING] if reloads % 2 else []))
            time.sleep(max(0.0, started + reloads * FLAP_PERIOD - time.time()))
        flapped = time.time() - started
        last_unhealthy = reloads % 2 == 1
        expected = GIZMOS - 1 if last_unhealthy and not tainting else GIZMOS  # withdrawn, or tainted
        until(
            lambda: (
                published(kit, expected, count) and flapping_tainted(kit) == (last_unhealthy and tainting)
            ),
            f"the pool at the last health ({expected} gizmos, {FLAPPING} tainted: {last_unhealthy and tainting})",
            30,
        )
        time.sleep(2.0)  # anything written late is seen too
    finally:
        watch.terminate()
        watch.wait(timeout=10)
    updates = [t for t in written_at(host, "ResourceSlice updated")[before:] if t >= started]
    seen = watched.read_text().count('"MODIFIED"')
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(updates)]
    flapping_writes = len([t for t in updates if t < started + flapped])
    changes = len(host.events("devices changed")) - changed_before  # what the host's table saw
    note(
        kit,
        f"flap: {reloads} health changes of {FLAPPING} in {flapped:.1f} s (SIGHUP every "
        f"{FLAP_PERIOD * 1000:g} ms), {changes} seen by the host's device table: it wrote "
        f"{flapping_writes} slice updates while it "
        f"flapped ({flapping_writes / flapped:.2f}/s), {len(updates)} with the last state; the "
        f"watch of {name} saw {seen} MODIFIED; seconds between writes {gaps}",
    )
    assert 1 <= len(updates) <= math.ceil(flapped) + 1, updates
    assert changes >= reloads // 2, changes  # it flapped on the host, not only in the file
    assert all(gap >= 0.99 for gap in gaps), gaps
    assert seen == len(updates), (seen, updates)
    devices = {d["name"] for s in driver_slices(kit, DRIVER) for d in s["spec"]["devices"]}
    assert (FLAPPING in devices) is not (last_unhealthy and not tainting)  # withdrawn, or kept tainted
    host.reload(config(node, []))
    until(
        lambda: published(kit, GIZMOS, count) and not flapping_tainted(kit),
        f"all {GIZMOS} gizmos published again, untainted",
        30,
    )
