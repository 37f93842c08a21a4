"""DRA in tests: the in-memory API server, and the kubelet's DRA calls over the wire.

:class:`ClusterStandIn` is :class:`devicehost.standin.apiserver.ApiServerStandIn` (the API server
and scheduler ``--simulate-kubelet`` runs too): a test allocates a claim on it, has the driver
prepare it (:func:`prepare`), unprepares it (:func:`unprepare`) and deletes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc
from devicehost.proto.pluginregistration.v1 import api_pb2 as registration_pb2
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from devicehost.standin.allocator import CANNOT_ALLOCATE
from devicehost.standin.apiserver import NODE_UID, ApiServerStandIn, Unschedulable, claim_spec

ClusterStandIn = ApiServerStandIn
"""The in-memory API server under the name the tests know it by."""

__all__ = [
    "CANNOT_ALLOCATE",
    "NODE_UID",
    "ClusterStandIn",
    "Unschedulable",
    "claim_spec",
    "prepare",
    "registered_endpoint",
    "unprepare",
]


async def registered_endpoint(registration_socket: Path) -> registration_pb2.PluginInfo:
    """What a DRA registration socket tells the kubelet's plugin watcher (GetInfo), then report
    the registration as the kubelet does."""
    async with grpc.aio.insecure_channel(f"unix:{registration_socket}") as channel:
        stub = registration_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=5)
        await stub.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
        )
        return info


async def prepare(
    endpoint: str, claims: Sequence[tuple[str, str, str]]
) -> api_pb2.NodePrepareResourcesResponse:
    """NodePrepareResources as the kubelet calls it, for (namespace, uid, name) claims."""
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        request = api_pb2.NodePrepareResourcesRequest(
            claims=[api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        return await api_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=10)


async def unprepare(
    endpoint: str, claims: Sequence[tuple[str, str, str]]
) -> api_pb2.NodeUnprepareResourcesResponse:
    """NodeUnprepareResources as the kubelet calls it."""
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        request = api_pb2.NodeUnprepareResourcesRequest(
            claims=[api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        return await api_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=10)
