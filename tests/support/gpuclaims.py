"""ResourceClaims of the dra-example driver (gpu.example.com) with a GpuConfig, good and bad:
what the webhook e2e tests send the API server, and the refusal its model words."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.example.com"
GOOD = {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "GpuConfig"}
BAD = {**GOOD, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}}
KEY_PATH = "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval"
MODEL_WORDS = "Input should be 'Default', 'Short', 'Medium' or 'Long'"
DENIED = 'admission webhook "claim-config.devicehost.io" denied the request'


def claim(
    parameters: dict[str, Any] | None,
    version: str = "v1",
    driver: str = DRIVER,
    name: str = "webhook-e2e",
) -> dict[str, Any]:
    """A claim in ``default`` for one gpu.example.com device, configured with ``parameters``
    for ``driver`` (none: no config)."""
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
    if version == "v1beta1":
        request = {"name": "gpu", "deviceClassName": "gpu.example.com"}
    devices: dict[str, Any] = {"requests": [request]}
    if parameters is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}]
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices},
    }


def template(parameters: dict[str, Any]) -> dict[str, Any]:
    """A v1 ResourceClaimTemplate whose claims carry ``parameters``."""
    inner = claim(parameters)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "webhook-e2e", "namespace": "default"},
        "spec": {"spec": inner["spec"]},
    }
