"""The ``resource.k8s.io/v1`` objects the DRA side reads, as plain values: a leaf module.

The host's API server seam (:mod:`devicehost.host.dra.cluster`), its client
(:mod:`devicehost.host.dra.kube`) and the in-memory API server of the stand-ins
(:mod:`devicehost.standin.apiserver`) all speak these, so none of them imports another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SLICE_API_VERSION = "resource.k8s.io/v1"


class ClusterError(Exception):
    """The API server refused or could not be reached; the message says which and why."""


class NotFound(ClusterError):
    """The object is not there (404): deleted, or never made."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One device the scheduler allocated to a claim, as the claim's status names it.

    ``request`` is ``request/subrequest`` when a prioritized list (``firstAvailable``) chose it.
    """

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str = ""
    """The allocation's ``shareID`` on a device that allows multiple allocations; "" otherwise."""
    consumed: Mapping[str, str] = field(default_factory=dict, hash=False)
    """What the share takes of each capacity (``consumedCapacity``), as quantity strings."""
    binding_conditions: tuple[str, ...] = ()
    """Conditions the scheduler awaits in the claim's ``status.devices`` before it binds the pod."""
    binding_failure_conditions: tuple[str, ...] = ()
    """Conditions that, once True there, make the scheduler give the device up."""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(driver, pool, device, share ID): what names its entry in the claim's ``status.devices``."""
        return self.driver, self.pool, self.device, self.share_id


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque configuration of an allocation (its DeviceClasses' first, then the claim's).

    ``requests`` empty: it applies to every request of the claim.
    """

    driver: str
    parameters: Mapping[str, Any]
    requests: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimAllocation:
    """A ResourceClaim as the host reads it, once per use: its UID, allocated devices and
    configuration, and the ``status.devices`` it shows (prepare, claim status and binding
    conditions all read this one model)."""

    uid: str
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()
    namespace: str = ""
    name: str = ""
    statuses: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """Its ``status.devices`` entries, as the API server shows them."""
    body: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)
    """The claim as read (JSON, with its resourceVersion): what a status write sends back."""

    def devices_of(self, driver: str) -> tuple[AllocatedDevice, ...]:
        """Its allocated devices of ``driver``."""
        return tuple(d for d in self.devices if d.driver == driver)

    def status_of(self, device: AllocatedDevice) -> Mapping[str, Any] | None:
        """The ``status.devices`` entry of ``device``, if the claim shows one."""
        return next((s for s in self.statuses if status_key(s) == device.key), None)

    def config(self, driver: str, request: str) -> OpaqueConfig | None:
        """The configuration of ``driver`` that applies to ``request``: the last one naming it, its
        main request (for ``main/sub``), or no request at all, in the API's order (later wins)."""
        names = {request, request.partition("/")[0]}
        for config in reversed(self.configs):
            if config.driver == driver and (not config.requests or names & set(config.requests)):
                return config
        return None


def status_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(driver, pool, device, share ID) of a ``status.devices`` entry: :attr:`AllocatedDevice.key`."""
    return (
        entry.get("driver", ""),
        entry.get("pool", ""),
        entry.get("device", ""),
        entry.get("shareID") or "",
    )


def allocated_device(result: Mapping[str, Any]) -> AllocatedDevice:
    """One result of a claim's allocation (as JSON): its device, admin access, share and binding conditions."""
    return AllocatedDevice(
        result["request"],
        result["driver"],
        result["pool"],
        result["device"],
        bool(result.get("adminAccess", False)),
        str(result.get("shareID") or ""),
        {str(k): str(v) for k, v in (result.get("consumedCapacity") or {}).items()},
        tuple(result.get("bindingConditions") or ()),
        tuple(result.get("bindingFailureConditions") or ()),
    )


def claim_allocation(claim: Mapping[str, Any]) -> ClaimAllocation:
    """A ResourceClaim (as JSON) as the host reads it: UID, name, devices, opaque configs, status."""
    status = claim.get("status") or {}
    devices = (status.get("allocation") or {}).get("devices") or {}
    meta = claim.get("metadata") or {}
    return ClaimAllocation(
        str(meta.get("uid", "")),
        tuple(allocated_device(r) for r in devices.get("results") or ()),
        tuple(
            OpaqueConfig(
                c["opaque"]["driver"], c["opaque"].get("parameters") or {}, tuple(c.get("requests") or ())
            )
            for c in devices.get("config") or ()
            if c.get("opaque")
        ),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        tuple(dict(d) for d in status.get("devices") or ()),
        claim,
    )


UNHEALTHY_TAINT = "devicehost.io/unhealthy"
"""The key of the taint an unhealthy device is published with (where the API keeps taints)."""


def taint_probe(node: str, driver: str) -> dict[str, Any]:
    """A ResourceSlice of one tainted device, to create as a dry run: whether the API server
    keeps the taint says whether it has device taints (``DRADeviceTaints``)."""
    return {
        "apiVersion": SLICE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"devicehost-taint-probe-{node}"[:253]},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": f"{node}/devicehost-taint-probe", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "probe", "taints": [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]}],
        },
    }


# -- claim status ---------------------------------------------------------------------------------


class Conflict(ClusterError):
    """A write named a resourceVersion that is no longer the object's: read it again and retry."""


CLAIM_EVENTS = ("ADDED", "MODIFIED", "DELETED")
"""What :meth:`~devicehost.host.dra.cluster.Cluster.claim_events` says happened to a claim."""


# -- what the API server serves -------------------------------------------------------------------

RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
"""The ``resource.k8s.io`` versions a 1.34 to 1.37 API server may serve, newest first."""

SLICE_FEATURES = {
    "taints": "device taints in slices",
    "bindingConditions": "binding conditions",
    "allowMultipleAllocations": "consumable capacity",
}
"""Device fields an API server keeps only with their feature on (else drops), by what they give."""


@dataclass(frozen=True)
class ServedApi:
    """What the API server serves of DRA, probed once at the host's start."""

    versions: tuple[str, ...]
    """The ``resource.k8s.io`` versions served, newest first."""
    taint_rules: str = ""
    """The served version that has DeviceTaintRule ("": none)."""
    kept: tuple[str, ...] = ()
    """The :data:`SLICE_FEATURES` fields it keeps on a ResourceSlice."""

    @property
    def features(self) -> dict[str, bool]:
        """Each DRA feature the host looks for: whether the cluster has it."""
        found = {what: field in self.kept for field, what in SLICE_FEATURES.items()}
        return found | {"DeviceTaintRule": bool(self.taint_rules)}


def feature_probe(node: str, driver: str, field_name: str) -> dict[str, Any]:
    """A ResourceSlice of one device with the :data:`SLICE_FEATURES` field ``field_name`` set, to
    create as a dry run: whether the API server keeps it says whether it has the feature."""
    fields: dict[str, dict[str, Any]] = {
        "taints": {"taints": [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]},
        "bindingConditions": {
            "bindingConditions": ["DevicehostProbe"],
            "bindingFailureConditions": ["DevicehostProbeFailed"],
        },
        "allowMultipleAllocations": {"allowMultipleAllocations": True},
    }
    device = fields[field_name]
    probe = taint_probe(node, driver)
    probe["spec"]["devices"] = [{"name": "probe", **device}]
    return probe
