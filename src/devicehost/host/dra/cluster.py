"""What the DRA side needs from the API server, as a seam: production talks to a real one
(:mod:`devicehost.host.dra.kube`), ``--simulate-kubelet`` and the test kit to an in-memory one
(:mod:`devicehost.standin.apiserver`). The values it carries live in :mod:`devicehost.resourceapi`.

ResourceSlices travel as plain JSON-shaped dicts (``resource.k8s.io/v1``), so nothing outside
:mod:`~devicehost.host.dra.kube` imports a Kubernetes client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from devicehost.resourceapi import (
    SLICE_API_VERSION,
    AllocatedDevice,
    ClaimAllocation,
    ClusterError,
    Conflict,
    NotFound,
    OpaqueConfig,
    ServedApi,
)

__all__ = [
    "SLICE_API_VERSION",
    "AllocatedDevice",
    "ClaimAllocation",
    "Cluster",
    "ClusterError",
    "Conflict",
    "NotFound",
    "OpaqueConfig",
    "ServedApi",
]


class Cluster(Protocol):
    """The API server calls of the DRA side. Every method raises :class:`ClusterError`."""

    async def node_uid(self, node: str) -> str:
        """The Node object's UID (ResourceSlices are owned by it, and go when it goes)."""

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        """The named ResourceClaim: UID, allocation (no devices when not allocated), configuration
        and ``status.devices``, parsed once (:func:`devicehost.resourceapi.claim_allocation`)."""

    async def slices(self, node: str, driver: str) -> dict[str, Mapping[str, Any]]:
        """This node's ResourceSlices of ``driver``, by name."""

    async def device_taints(self, node: str, driver: str) -> bool:
        """Whether the API server keeps device taints on ResourceSlices (feature gate
        ``DRADeviceTaints``; without it the field is dropped): a dry-run create, nothing stored."""

    async def served_api(self, node: str, driver: str) -> ServedApi:
        """Which ``resource.k8s.io`` versions it serves, which of them has DeviceTaintRule, and
        which feature-gated slice fields it keeps (dry-run creates, nothing stored)."""

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create a ResourceSlice; the slice as stored (without the fields the API server drops)."""

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """Replace a ResourceSlice (``body`` carries the resourceVersion it replaces); the slice
        as stored."""

    async def delete_slice(self, name: str) -> None:
        """Delete a ResourceSlice; one that is gone already is no error."""

    def slice_events(self, node: str, driver: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        """(``ADDED``, ``MODIFIED`` or ``DELETED``, the slice as JSON) for this node's slices of
        ``driver``, those there now first, then as anyone changes them, for ever."""

    # -- claim status (binding conditions, device status) --

    async def replace_claim_status(self, body: Mapping[str, Any]) -> None:
        """Replace a ResourceClaim's status with ``body``'s (a claim's :attr:`ClaimAllocation.body`
        with a new status); :class:`Conflict` when its resourceVersion is not the claim's any more."""

    def claim_events(self) -> AsyncIterator[tuple[str, ClaimAllocation]]:
        """(``ADDED``, ``MODIFIED`` or ``DELETED``, the claim) for every ResourceClaim of every
        namespace, those there now first, then as they change, for ever."""

    async def close(self) -> None:
        """Let go of connections."""
