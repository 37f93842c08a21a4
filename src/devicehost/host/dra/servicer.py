"""The kubelet's DRAPlugin service, a thin layer over the driver (health: :mod:`.health`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc

from devicehost.host.dra.checkpoint import PreparedClaim
from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc

SERVICE = "v1.DRAPlugin"
"""What a driver lists among its supported versions to offer this service (kubelet 1.34+)."""

ClaimRef = tuple[str, str, str]
"""(namespace, uid, name), as the kubelet names a claim."""
Prepare = Callable[[Sequence[ClaimRef]], Awaitable[dict[str, PreparedClaim | str]]]
Unprepare = Callable[[Sequence[ClaimRef]], Awaitable[dict[str, str]]]
Observe = Callable[[str, Iterable[bool], float], None]
"""(``prepare`` or ``unprepare``, each claim's outcome, the call's seconds)."""


def _unobserved(operation: str, outcomes: Iterable[bool], seconds: float) -> None:
    """No metrics."""


class DraPluginServicer(api_pb2_grpc.DRAPluginServicer):
    """Turns the kubelet's calls into plain ones: a claim's answer is its devices or one error."""

    def __init__(self, prepare: Prepare, unprepare: Unprepare, observe: Observe = _unobserved) -> None:
        self._prepare = prepare
        self._unprepare = unprepare
        self._observe = observe

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.NodePrepareResourcesResponse:
        started = time.monotonic()
        answers = await self._prepare([(c.namespace, c.uid, c.name) for c in request.claims])
        self._observe(
            "prepare", (not isinstance(a, str) for a in answers.values()), time.monotonic() - started
        )
        response = api_pb2.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            if isinstance(answer, str):
                response.claims[uid].error = answer
                continue
            response.claims[uid].devices.extend(
                api_pb2.Device(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_ids,
                    share_id=d.share or None,
                )
                for d in answer.devices
            )
        return response

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        started = time.monotonic()
        errors = await self._unprepare([(c.namespace, c.uid, c.name) for c in request.claims])
        self._observe("unprepare", (not e for e in errors.values()), time.monotonic() - started)
        response = api_pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response
