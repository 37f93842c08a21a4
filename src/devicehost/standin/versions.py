"""What each Kubernetes version, 1.34 to 1.37, presents to a DRA driver: the one table.

The kubelet stand-in (which DRA and health gRPC services it speaks), the API server stand-in
(which ``resource.k8s.io`` versions and kinds it serves, which fields it keeps) and docs/dra.md's
"Versions" table (tested against :data:`FEATURES`) all read it. Facts as of each version's
release with its default feature gates; an operator may turn gates on or off (``gates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from devicehost.resourceapi import ServedApi

DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""The DRAPlugin services every kubelet from 1.34 on accepts; it picks the first a driver lists."""

HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
HEALTH_V1 = "v1.DRAResourceHealth"


@dataclass(frozen=True)
class Feature:
    """One DRA feature gate: its stage and default in each version, and what devicehost does."""

    gate: str
    stages: Mapping[str, str]
    """Version -> ``alpha``, ``beta``, ``GA`` (absent: not there yet)."""
    on: frozenset[str]
    """The versions in which it is on by default."""
    devicehost: str
    """What devicehost does with it (for the docs' table)."""


def _feature(gate: str, stages: str, on: str, devicehost: str) -> Feature:
    """``stages``: four stages for 1.34 to 1.37 (``-``: not there); ``on``: the default-on versions."""
    return Feature(
        gate,
        {v: s for v, s in zip(VERSIONS, stages.split(), strict=True) if s != "-"},
        frozenset(on.split()),
        devicehost,
    )


VERSIONS = ("1.34", "1.35", "1.36", "1.37")
"""The Kubernetes versions devicehost speaks, oldest first."""

FEATURES: tuple[Feature, ...] = (
    _feature("DRAPrioritizedList", "beta beta GA GA", "1.34 1.35 1.36 1.37",
             "prepares the subrequest the scheduler chose (request/subrequest)"),
    _feature("DRAAdminAccess", "beta beta GA GA", "1.34 1.35 1.36 1.37",
             "prepares an admin-access claim beside the claims holding the device"),
    _feature("DRAResourceClaimDeviceStatus", "beta beta beta GA", "1.34 1.35 1.36 1.37",
             "writes the claim's status.devices from the device status hook"),
    _feature("DRAPartitionableDevices", "alpha beta beta GA", "1.36 1.37",
             "publishes counter sets and what each partition consumes"),
    _feature("DRAConsumableCapacity", "alpha alpha beta beta", "1.36 1.37",
             "prepares shares of a device that allows multiple allocations; share_id to the kubelet"),
    _feature("DRADeviceTaints", "alpha alpha beta GA", "1.36 1.37",
             "taints an unhealthy device in its slice; without it withdraws the device"),
    _feature("DRADeviceTaintRules", "- alpha beta GA", "1.37",
             "nothing to do: an admin's DeviceTaintRule keeps pods off the devices it names"),
    _feature("DRADeviceBindingConditions", "alpha alpha beta beta", "1.36 1.37",
             "publishes binding conditions and reports them through the device status hook"),
    _feature("DRAExtendedResource", "alpha alpha beta GA", "1.36 1.37",
             "nothing to do: a DeviceClass's extendedResourceName (deploy/components/dra) lets pods ask as before"),
    _feature("ResourceHealthStatus", "alpha alpha beta beta", "1.36 1.37",
             "streams device health to the kubelet (v1alpha1 to 1.36, v1 to 1.37)"),
)  # fmt: skip


@dataclass(frozen=True)
class KubernetesVersion:
    """One version's surface, with its default gates (or ``gates`` set over them)."""

    version: str
    gates: Mapping[str, bool] = field(default_factory=dict)
    """Feature gates set by the operator, over the version's defaults."""

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"Kubernetes version {self.version!r} is not one of {', '.join(VERSIONS)}")
        unknown = sorted(set(self.gates) - {f.gate for f in FEATURES})
        if unknown:
            raise ValueError(f"unknown DRA feature gates {unknown}")

    def enabled(self, gate: str) -> bool:
        """Whether the feature ``gate`` is on (set, else the version's default)."""
        feature = next(f for f in FEATURES if f.gate == gate)
        if self.version not in feature.stages:
            return False
        return self.gates.get(gate, self.version in feature.on)

    @property
    def health_service(self) -> str | None:
        """The health stream the kubelet opens to every DRA driver (None: it opens none)."""
        if not self.enabled("ResourceHealthStatus"):
            return None
        return HEALTH_V1 if self.version >= "1.37" else HEALTH_V1ALPHA1

    @property
    def resource_versions(self) -> tuple[str, ...]:
        """The ``resource.k8s.io`` versions served by default (the betas and alphas need
        ``--runtime-config``)."""
        return ("v1",)

    @property
    def taint_rule_versions(self) -> tuple[str, ...]:
        """The ``resource.k8s.io`` versions that have the DeviceTaintRule kind (each still needs
        serving: only ``v1`` is by default)."""
        return {"1.34": ("v1alpha3",), "1.35": ("v1alpha3",), "1.36": ("v1alpha3", "v1beta2")}.get(
            self.version, ("v1", "v1beta2")
        )

    @property
    def taint_rules_served(self) -> bool:
        """Whether DeviceTaintRule is served by default (a version it lives in is served)."""
        taints = self.enabled("DRADeviceTaints") and (
            self.version == "1.34" or self.enabled("DRADeviceTaintRules")
        )
        return taints and any(v in self.resource_versions for v in self.taint_rule_versions)

    def served_api(self, taints_kept: bool) -> ServedApi:
        """What its API server serves of DRA (device taints kept or not, whatever the gate)."""
        gates = {
            "bindingConditions": "DRADeviceBindingConditions",
            "allowMultipleAllocations": "DRAConsumableCapacity",
        }
        kept = ["taints"] if taints_kept else []
        kept += [f for f, gate in gates.items() if self.enabled(gate)]
        rules = [v for v in self.resource_versions if v in self.taint_rule_versions]
        return ServedApi(
            self.resource_versions, rules[0] if rules and self.taint_rules_served else "", tuple(kept)
        )


def parse(version: str) -> KubernetesVersion:
    """A version from ``1.36``, ``v1.36`` or ``1.36.2``; ValueError naming the ones known."""
    parts = version.removeprefix("v").split(".")
    return KubernetesVersion(".".join(parts[:2]))
