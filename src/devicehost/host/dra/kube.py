"""The API server through lightkube (async, typed ``resource.k8s.io/v1`` models, small).

Compared for this job: the official ``kubernetes`` client is synchronous (every call would need a
thread) and heavy to import; ``kubernetes_asyncio`` is async but as heavy, generated per
release; lightkube is asyncio-native over httpx, has the v1 DRA models from lightkube-models, and
reads in-cluster credentials or a kubeconfig with one call. It is imported only when a resource
is served through DRA, so the device plugin path pays nothing for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice

from devicehost.host.dra.cluster import ClaimAllocation, ClusterError, Conflict, NotFound
from devicehost.resourceapi import (
    RESOURCE_VERSIONS,
    SLICE_FEATURES,
    ServedApi,
    claim_allocation,
    feature_probe,
    taint_probe,
)

FIELD_MANAGER = "devicehost"
_GENERIC: dict[tuple[str, str], Any] = {}
"""Generic resources made for the discovery probe, by (version, kind)."""
NOT_FOUND = 404
CONFLICT = 409


class KubeCluster:
    """:class:`~devicehost.host.dra.cluster.Cluster` on a real API server.

    The client is made at the first call, so a missing kubeconfig is an error of that call
    (retried with backoff by the caller), never of the host's start.
    """

    def __init__(self, kubeconfig: Path | None) -> None:
        self._kubeconfig = kubeconfig
        self._client: AsyncClient | None = None

    def _api(self) -> AsyncClient:
        if self._client is None:
            try:
                config = KubeConfig.from_file(self._kubeconfig) if self._kubeconfig else KubeConfig.from_env()
            except (ConfigError, OSError) as exc:
                raise ClusterError(f"no API server credentials: {exc}") from None
            self._client = AsyncClient(config=config, field_manager=FIELD_MANAGER)
        return self._client

    async def node_uid(self, node: str) -> str:
        with _errors(f"node {node}"):
            found = await self._api().get(Node, node)
        return str(found.metadata.uid if found.metadata else "")

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        with _errors(f"ResourceClaim {namespace}/{name}"):
            claim = await self._api().get(ResourceClaim, name, namespace=namespace)
        return claim_allocation(claim.to_dict())

    async def slices(self, node: str, driver: str) -> dict[str, Mapping[str, Any]]:
        found: dict[str, Mapping[str, Any]] = {}
        with _errors("listing ResourceSlices"):
            async for item in self._api().list(ResourceSlice, fields=_mine(node, driver)):
                if item.metadata and item.metadata.name:
                    found[item.metadata.name] = item.to_dict()
        return found

    async def device_taints(self, node: str, driver: str) -> bool:
        probe = taint_probe(node, driver)
        with _errors("probing for device taints (a dry-run ResourceSlice)"):
            created = await self._api().create(
                cast(ResourceSlice, ResourceSlice.from_dict(probe)), dry_run=True
            )
        devices = created.to_dict().get("spec", {}).get("devices") or [{}]
        return bool(devices[0].get("taints"))

    async def served_api(self, node: str, driver: str) -> ServedApi:
        versions = [v for v in RESOURCE_VERSIONS if await self._serves(v, "ResourceSlice", "resourceslices")]
        rules = [v for v in versions if await self._serves(v, "DeviceTaintRule", "devicetaintrules")]
        kept = []
        for name in SLICE_FEATURES:
            with _errors(f"probing for {SLICE_FEATURES[name]} (a dry-run ResourceSlice)"):
                body = cast(ResourceSlice, ResourceSlice.from_dict(feature_probe(node, driver, name)))
                created = await self._api().create(body, dry_run=True)
            devices = created.to_dict().get("spec", {}).get("devices") or [{}]
            if devices[0].get(name):
                kept.append(name)
        return ServedApi(tuple(versions), rules[0] if rules else "", tuple(kept))

    async def _serves(self, version: str, kind: str, plural: str) -> bool:
        """Whether ``resource.k8s.io/<version>`` serves ``kind`` (one list of at most one item)."""
        resource = _GENERIC.get((version, kind)) or create_global_resource(
            "resource.k8s.io", version, kind, plural
        )
        _GENERIC[(version, kind)] = resource
        try:
            with _errors(f"listing resource.k8s.io/{version} {plural}"):
                async for _ in self._api().list(resource, chunk_size=1):
                    break
        except NotFound:
            return False
        return True

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        with _errors(f"creating ResourceSlice {body['metadata']['name']}"):
            created = await self._api().create(cast(ResourceSlice, ResourceSlice.from_dict(dict(body))))
        return dict(created.to_dict())

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        with _errors(f"replacing ResourceSlice {body['metadata']['name']}"):
            replaced = await self._api().replace(cast(ResourceSlice, ResourceSlice.from_dict(dict(body))))
        return dict(replaced.to_dict())

    async def delete_slice(self, name: str) -> None:
        try:
            with _errors(f"deleting ResourceSlice {name}"):
                await self._api().delete(ResourceSlice, name)
        except NotFound:
            pass

    async def slice_events(self, node: str, driver: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        with _errors("watching ResourceSlices"):
            async for kind, item in self._api().watch(ResourceSlice, fields=_mine(node, driver)):
                yield kind, item.to_dict()

    async def replace_claim_status(self, body: Mapping[str, Any]) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        with _errors(f"writing the status of ResourceClaim {namespace}/{name}"):
            status = cast(ResourceClaimStatus, ResourceClaimStatus.from_dict(dict(body)))
            await self._api().replace(status, name, namespace=namespace)

    async def claim_events(self) -> AsyncIterator[tuple[str, ClaimAllocation]]:
        with _errors("watching ResourceClaims"):
            async for kind, item in self._api().watch(ResourceClaim, namespace=ALL_NS):
                yield kind, claim_allocation(item.to_dict())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _mine(node: str, driver: str) -> dict[str, Any]:
    return {"spec.nodeName": node, "spec.driver": driver}


@contextlib.contextmanager
def _errors(doing: str) -> Iterator[None]:
    """Turn the client's errors into one-line :class:`ClusterError`s naming what was done."""
    try:
        yield
    except ApiError as exc:
        status = exc.status
        error = {NOT_FOUND: NotFound, CONFLICT: Conflict}.get(status.code or 0, ClusterError)
        raise error(f"{doing}: {status.code} {status.reason}: {status.message}") from None
    except (httpx2.HTTPError, OSError) as exc:
        raise ClusterError(f"{doing}: {type(exc).__name__}: {exc}") from None
