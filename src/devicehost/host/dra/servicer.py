"""The kubelet's DRAPlugin and DRAResourceHealth services, thin layers over the driver."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from devicehost.host.dra.checkpoint import PreparedClaim
from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc
from devicehost.proto.drahealth.v1alpha1 import api_pb2 as health_pb2
from devicehost.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc

SERVICE = "v1.DRAPlugin"
"""What a driver lists among its supported versions to offer this service (kubelet 1.34+)."""

ClaimRef = tuple[str, str, str]
"""(namespace, uid, name), as the kubelet names a claim."""
Prepare = Callable[[Sequence[ClaimRef]], Awaitable[dict[str, PreparedClaim | str]]]
Unprepare = Callable[[Sequence[ClaimRef]], Awaitable[dict[str, str]]]


class DraPluginServicer(api_pb2_grpc.DRAPluginServicer):
    """Turns the kubelet's calls into plain ones: a claim's answer is its devices or one error."""

    def __init__(self, prepare: Prepare, unprepare: Unprepare) -> None:
        self._prepare = prepare
        self._unprepare = unprepare

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.NodePrepareResourcesResponse:
        answers = await self._prepare([(c.namespace, c.uid, c.name) for c in request.claims])
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
                )
                for d in answer.devices
            )
        return response

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        errors = await self._unprepare([(c.namespace, c.uid, c.name) for c in request.claims])
        response = api_pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
"""What a driver lists to offer device health (kubelet feature gate ResourceHealthStatus)."""

DeviceHealth = tuple[str, str, bool]
"""(pool, device name, healthy)."""


HEALTH_REFRESH = 10.0
"""Seconds between health lists sent without a change: the kubelet reads a device's health as
Unknown once it is 30 s old (its default health timeout)."""


class DraHealthServicer(health_grpc.DRAResourceHealthServicer):
    """Streams every device's health to the kubelet: the whole list now, after each change, and
    every ``refresh`` seconds anyway."""

    def __init__(
        self,
        devices: Callable[[], list[DeviceHealth]],
        changed: Callable[[int], Awaitable[int]],
        refresh: float = HEALTH_REFRESH,
    ) -> None:
        self._devices = devices
        self._changed = changed
        self._refresh = refresh

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        seen = -1
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if seen == -1 else self._refresh):
                    seen = await self._changed(seen)
            now = int(time.time())
            yield health_pb2.NodeWatchResourcesResponse(
                devices=[
                    health_pb2.DeviceHealth(
                        device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=name),
                        health=health_pb2.HEALTHY if healthy else health_pb2.UNHEALTHY,
                        last_updated_time=now,
                    )
                    for pool, name, healthy in self._devices()
                ]
            )
