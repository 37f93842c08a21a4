"""Device metadata for containers (KEP-5304), for resources whose backend opts in
(``Resource(device_metadata=True)``).

For each request of a prepared claim with such devices the host writes one ``DeviceMetadata``
file (``metadata.resource.k8s.io/v1alpha1``: the claim, and each device's driver, pool, name and
published attributes) under ``<plugins dir>/<driver>/dra-device-metadata/<claim uid>/``, and a
CDI spec of its own (kind ``<driver>/metadata-<claim uid>``) that mounts it read-only where
containers look for it: ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/
<request>/<driver>-metadata.json``, or ``resourceclaimtemplates/<pod claim name>/...`` for a claim
made from a template. The request's first device carries that CDI ID to the kubelet. Both go
when the claim is unprepared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicehost import cdi
from devicehost._files import write_atomically
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import PreparedClaim, PreparedDevice
from devicehost.host.dra.cluster import ClaimAllocation, Cluster, ClusterError
from devicehost.host.dra.slices import device_entry

if TYPE_CHECKING:
    from devicehost.host.context import HostContext
    from devicehost.host.dra.allocated import Attached

CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
API_VERSION = "metadata.resource.k8s.io/v1alpha1"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
"""The annotation naming the pod's claim on a claim made from a ResourceClaimTemplate."""
HOST_DIR = "dra-device-metadata"


def container_path(claim: str, pod_claim: str | None, request: str, driver: str) -> str:
    """Where a container finds the metadata of ``request`` (its top-level name) of the claim."""
    where = f"resourceclaimtemplates/{pod_claim}" if pod_claim else f"resourceclaims/{claim}"
    return f"{CONTAINER_ROOT}/{where}/{request.partition('/')[0]}/{driver}-metadata.json"


def document(
    claim: PreparedClaim, pod_claim: str | None, driver: str, devices: Mapping[str, Sequence[dict[str, Any]]]
) -> dict[str, Any]:
    """One ``DeviceMetadata`` object: the claim, and ``devices`` (published entries) by full request name."""
    return {
        "kind": "DeviceMetadata",
        "apiVersion": API_VERSION,
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": 1},
        **({"podClaimName": pod_claim} if pod_claim else {}),
        "requests": [
            {"name": request, "devices": [{"driver": driver, **entry} for entry in entries]}
            for request, entries in devices.items()
        ],
    }


class DeviceMetadata:
    """The metadata files and CDI specs of one driver's prepared claims."""

    def __init__(
        self,
        driver: str,
        cluster: Cluster,
        root: Path,
        context: HostContext | None,
        resources: Mapping[str, Attached],
    ) -> None:
        self._driver = driver
        self._cluster = cluster
        self._root = root
        self._context = context
        self._resources = resources

    @property
    def _cdi_dir(self) -> Path | None:
        """The host's live ``cdi_dir`` (None: the CDI helper's default)."""
        return None if self._context is None else self._context.config.cdi_dir

    async def add(
        self, answers: dict[str, PreparedClaim | str], reads: Mapping[str, ClaimAllocation | BaseException]
    ) -> dict[str, PreparedClaim | str]:
        """Each prepared claim with devices of an opted-in resource, with its metadata written and
        its CDI ID on the devices; a claim whose metadata cannot be written fails with why.
        ``reads``: the claims this call read (one prepared before is read again, opted-in only)."""
        for uid, answer in answers.items():
            if isinstance(answer, PreparedClaim) and self._wanted(answer.devices):
                try:
                    read = reads.get(uid)
                    if not isinstance(read, ClaimAllocation):
                        read = await self._cluster.claim(answer.namespace, answer.name)
                    answers[uid] = self._write(answer, read)
                except (ClusterError, OSError, ValueError) as exc:
                    answers[uid] = f"device metadata for the claim: {exc}"
        return answers

    def remove(self, uids: Sequence[str]) -> None:
        """Forget the metadata of unprepared claims: their CDI specs and files."""
        for uid in uids:
            with contextlib.suppress(ValueError):
                cdi.remove_spec(self._kind(uid), self._cdi_dir)
            shutil.rmtree(self._root / uid, ignore_errors=True)

    def _wanted(self, devices: Sequence[PreparedDevice]) -> list[PreparedDevice]:
        opted = {name for name, attached in self._resources.items() if attached.server.device_metadata}
        return [d for d in devices if d.resource in opted]

    def _kind(self, uid: str) -> str:
        return names.metadata_kind(self._driver, uid)

    def _write(self, claim: PreparedClaim, read: ClaimAllocation) -> PreparedClaim:
        pod_claim = (read.body.get("metadata", {}).get("annotations") or {}).get(POD_CLAIM_NAME)
        by_top: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for device in self._wanted(claim.devices):
            entry = {"pool": device.pool, "name": device.device, "attributes": self._attributes(device)}
            by_top.setdefault(device.request.partition("/")[0], {}).setdefault(device.request, []).append(
                entry
            )
        spec_devices, ids = [], {}
        for top, requests in by_top.items():
            host = self._root / claim.uid / top / f"{self._driver}-metadata.json"
            write_atomically(
                host, json.dumps(document(claim, pod_claim, self._driver, requests), indent=2), 0o644
            )
            mount = cdi.Mount(host_path=str(host), container_path=container_path(claim.name, pod_claim, top, self._driver), options=("bind", "ro"))  # fmt: skip
            name = f"{top}.metadata"  # a request name is a DNS label
            spec_devices.append(cdi.Device(name=name, edits=cdi.ContainerEdits(mounts=[mount])))
            ids[top] = f"{self._kind(claim.uid)}={name}"
        cdi.write_spec(cdi.Spec(kind=self._kind(claim.uid), devices=spec_devices), self._cdi_dir)
        return dataclasses.replace(claim, devices=_with_ids(claim.devices, ids))

    def _attributes(self, device: PreparedDevice) -> dict[str, Any]:
        attached = self._resources.get(device.resource)
        found = [d for d in attached.server.table.devices if d.id == device.device_id] if attached else []
        return dict(device_entry(found[0])["attributes"]) if found else {}


def _with_ids(devices: Sequence[PreparedDevice], ids: Mapping[str, str]) -> tuple[PreparedDevice, ...]:
    """``devices``, the first of each request named in ``ids`` carrying its CDI ID too."""
    given: set[str] = set()
    out = []
    for device in devices:
        top = device.request.partition("/")[0]
        if top in ids and top not in given:
            given.add(top)
            device = dataclasses.replace(device, cdi_ids=(*device.cdi_ids, ids[top]))
        out.append(device)
    return tuple(out)
