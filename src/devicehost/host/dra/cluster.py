"""What the DRA side needs from the API server, as a seam: production talks to a real one
(:mod:`devicehost.host.dra.kube`), the test kit to an in-memory stand-in.

ResourceSlices travel as plain JSON-shaped dicts (``resource.k8s.io/v1``), so nothing outside
:mod:`~devicehost.host.dra.kube` imports a Kubernetes client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

SLICE_API_VERSION = "resource.k8s.io/v1"


class ClusterError(Exception):
    """The API server refused or could not be reached; the message says which and why."""


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
    """A ResourceClaim as the kubelet plugin reads it: its UID, allocated devices and configuration."""

    uid: str
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()

    def config(self, driver: str, request: str) -> OpaqueConfig | None:
        """The configuration of ``driver`` that applies to ``request``: the last one naming it, its
        main request (for ``main/sub``), or no request at all, in the API's order (later wins)."""
        names = {request, request.partition("/")[0]}
        for config in reversed(self.configs):
            if config.driver == driver and (not config.requests or names & set(config.requests)):
                return config
        return None


class Cluster(Protocol):
    """The API server calls of the DRA side. Every method raises :class:`ClusterError`."""

    async def node_uid(self, node: str) -> str:
        """The Node object's UID (ResourceSlices are owned by it, and go when it goes)."""

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        """The named ResourceClaim's UID and allocation (no devices when not allocated)."""

    async def slices(self, node: str, driver: str) -> dict[str, Mapping[str, Any]]:
        """This node's ResourceSlices of ``driver``, by name."""

    async def create_slice(self, body: Mapping[str, Any]) -> None:
        """Create a ResourceSlice."""

    async def replace_slice(self, body: Mapping[str, Any]) -> None:
        """Replace a ResourceSlice (``body`` carries the resourceVersion it replaces)."""

    async def delete_slice(self, name: str) -> None:
        """Delete a ResourceSlice; one that is gone already is no error."""

    def slice_deletions(self, node: str, driver: str) -> AsyncIterator[str]:
        """Names of this node's slices of ``driver`` as they are deleted (by anyone), for ever."""

    async def close(self) -> None:
        """Let go of connections."""
