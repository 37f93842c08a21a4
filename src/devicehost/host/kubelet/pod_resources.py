"""The kubelet's pod-resources API as the host reads it: which container holds which device now.

:func:`list_holders` asks ``PodResourcesLister.List`` on the kubelet's pod-resources socket and
turns the answer into ``resource -> device ID -> Holder``. Each call dials a fresh channel and
closes it: a look happens every few seconds at most, and a kubelet that restarted (a new socket
file) is then reached without a stale connection.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from devicehost.host.state import Holder
from devicehost.proto.podresources.v1 import api_pb2, api_pb2_grpc

Holders = dict[str, dict[str, Holder]]
"""Resource name to device ID to the container the kubelet assigns it to."""

_CHANNEL_OPTIONS = [
    ("grpc.default_authority", "localhost"),
    ("grpc.enable_retries", 0),
    ("grpc.use_local_subchannel_pool", 1),
]


class PodResourcesError(Exception):
    """The pod-resources socket is missing or the kubelet did not answer List."""


def holders_of(response: api_pb2.ListPodResourcesResponse) -> Holders:
    """Every device in a List answer, by resource, with the container that holds it."""
    holders: Holders = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                by_id = holders.setdefault(devices.resource_name, {})
                by_id.update(dict.fromkeys(devices.device_ids, holder))
    return holders


def socket_missing(socket: Path) -> bool:
    """Whether no socket is at ``socket`` (older kubelets, or the feature turned off)."""
    return not socket.is_socket()


async def list_holders(socket: Path, timeout: float) -> Holders:  # noqa: ASYNC109
    """One ``List`` call; :class:`PodResourcesError` when the socket is missing or the call fails."""
    if socket_missing(socket):
        raise PodResourcesError(f"no pod-resources socket at {socket}")
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=_CHANNEL_OPTIONS) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(f"List failed: {exc.code().name}: {exc.details()}") from None
    return holders_of(response)
