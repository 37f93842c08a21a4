"""Device metadata for containers (KEP-5304) on the real host: a backend that opts in
(``Resource(device_metadata=True)``) gets, for each request of a prepared claim, a
``DeviceMetadata`` file that the claim's CDI IDs mount read-only where containers look for it
(``resourceclaims/<claim>/...``, or ``resourceclaimtemplates/<pod claim>/...`` for a claim made
from a template); unpreparing the claim takes both away."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import devicehost
from devicehost.host.dra.metadata import POD_CLAIM_NAME
from devicehost.standin import DraDevice, KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host
from devicehost_example import ExampleBackend

DRIVER = "example.com"
ROOT = "/var/run/kubernetes.io/dra-device-attributes"


class MetadataWidgets(ExampleBackend):
    """The example backend, its widgets' metadata asked for in containers."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [dataclasses.replace(r, device_metadata=True) for r in super().devicehost_discover()]


class TemplateClaims(ClusterStandIn):
    """Claims named ``pod0-...`` come from a ResourceClaimTemplate: the pod calls its claim ``gpu``."""

    def claim_body(self, namespace: str, name: str) -> dict[str, Any]:
        body = super().claim_body(namespace, name)
        if name.startswith("pod0-"):
            body["metadata"].setdefault("annotations", {})[POD_CLAIM_NAME] = "gpu"
        return body


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dmeta"))  # short socket paths
    yield path
    shutil.rmtree(path)


def mounted(cdi_dir: Path, devices: tuple[DraDevice, ...]) -> dict[str, str]:
    """The metadata the runtime mounts for ``devices``' CDI IDs, resolved from the specs:
    container path -> host path (read-only, every one)."""
    wanted = {i for d in devices for i in d.cdi_ids}
    found = {}
    for path in cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        for device in spec["devices"]:
            if f"{spec['kind']}={device['name']}" in wanted:
                for mount in device["containerEdits"].get("mounts", ()):
                    if not mount["containerPath"].startswith(ROOT):
                        continue  # the backend's own
                    assert "ro" in mount["options"], mount
                    found[mount["containerPath"]] = mount["hostPath"]
    return found


async def test_claims_get_their_devices_metadata_mounted_and_lose_it_when_unprepared(base: Path) -> None:
    cluster = TemplateClaims()
    async with (
        KubeletStandIn(base / "dp", base / "reg") as kubelet,
        running_host(
            kubelet.device_plugins_dir,
            {"example": MetadataWidgets()},
            cluster=cluster,
            serve_through={"example": "dra"},
            node_name="node-a",
            dra_plugins_dir=base / "plugins",
            plugins_registry_dir=base / "reg",
            cdi_dir=base / "cdi",
            device_release=False,
            backends={"example": {"resources": {"example.com/widget": 2}}},
        ),
    ):
        await kubelet.dra.wait_for_driver(DRIVER)
        await cluster.wait(lambda c: len(c.devices(DRIVER)) == 2)
        direct = cluster.allocate(DRIVER, devices=["widget-0"], name="direct", request="gpu")
        templated = cluster.allocate(DRIVER, devices=["widget-1"], name="pod0-gpu-x7k2p", request="gpu")
        prepared = await kubelet.dra.prepare(DRIVER, [direct, templated])

        seen = mounted(base / "cdi", prepared[direct[1]])
        path = f"{ROOT}/resourceclaims/direct/gpu/{DRIVER}-metadata.json"
        assert list(seen) == [path]
        metadata = json.loads(Path(seen[path]).read_text())
        assert metadata["kind"] == "DeviceMetadata"
        assert metadata["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
        assert metadata["metadata"] == {
            "name": "direct",
            "namespace": "default",
            "uid": direct[1],
            "generation": 1,
        }
        assert "podClaimName" not in metadata
        (request,) = metadata["requests"]
        assert request["name"] == "gpu"
        (device,) = request["devices"]
        assert (device["driver"], device["pool"], device["name"]) == (DRIVER, "node-a/widget", "widget-0")
        assert device["attributes"]["id"] == {"string": "widget-0"}
        assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}

        seen = mounted(base / "cdi", prepared[templated[1]])
        assert list(seen) == [f"{ROOT}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"]
        assert json.loads(Path(next(iter(seen.values()))).read_text())["podClaimName"] == "gpu"

        host_files = sorted(p.name for p in (base / "plugins" / DRIVER / "dra-device-metadata").iterdir())
        assert host_files == sorted([direct[1], templated[1]])
        await kubelet.dra.unprepare(DRIVER, [direct])
        assert not mounted(base / "cdi", prepared[direct[1]])  # its spec gone
        assert not (base / "plugins" / DRIVER / "dra-device-metadata" / direct[1]).exists()
        assert mounted(base / "cdi", prepared[templated[1]])  # the other claim keeps its own
