"""The kubelet's DRA health API in each version it speaks: ``v1alpha1.DRAResourceHealth``
(kubelet 1.34 to 1.36, gate ``ResourceHealthStatus``; beta and on from 1.36) and
``v1.DRAResourceHealth`` (1.37, which opens only that one). Both stream the same lists."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any

import grpc

from devicehost.proto.drahealth.v1 import api_pb2 as v1_pb2
from devicehost.proto.drahealth.v1 import api_pb2_grpc as v1_grpc
from devicehost.proto.drahealth.v1alpha1 import api_pb2 as v1alpha1_pb2
from devicehost.proto.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""What a driver lists among its supported versions to offer device health, newest first."""

DeviceHealth = tuple[str, str, bool, str]
"""(pool, device name, healthy, why: the backend's message)."""

HEALTH_REFRESH = 10.0
"""Seconds between health lists sent without a change: the kubelet reads a device's health as
Unknown once it is 30 s old (its default health timeout)."""


class HealthLists:
    """Every device's health: the whole list now, after each change, and every ``refresh``
    seconds anyway; one follower per kubelet stream."""

    def __init__(
        self,
        devices: Callable[[], list[DeviceHealth]],
        changed: Callable[[int], Awaitable[int]],
        refresh: float = HEALTH_REFRESH,
    ) -> None:
        self._devices = devices
        self._changed = changed
        self._refresh = refresh

    async def follow(self) -> AsyncIterator[tuple[int, list[DeviceHealth]]]:
        """(unix seconds, every device's health), for ever."""
        seen = -1
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if seen == -1 else self._refresh):
                    seen = await self._changed(seen)
            yield int(time.time()), self._devices()


def _response(pb2: ModuleType, now: int, devices: list[DeviceHealth]) -> Any:
    """One NodeWatchResourcesResponse of the version whose generated module is ``pb2``."""
    return pb2.NodeWatchResourcesResponse(
        devices=[
            pb2.DeviceHealth(
                device=pb2.DeviceIdentifier(pool_name=pool, device_name=name),
                health=pb2.HEALTHY if healthy else pb2.UNHEALTHY,
                last_updated_time=now,
                message=message,
            )
            for pool, name, healthy, message in devices
        ]
    )


class HealthServicerV1(v1_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``: the kubelet 1.37 stream."""

    def __init__(self, lists: HealthLists) -> None:
        self._lists = lists

    async def NodeWatchResources(
        self, request: v1_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[v1_pb2.NodeWatchResourcesResponse]:
        async for now, devices in self._lists.follow():
            yield _response(v1_pb2, now, devices)


class HealthServicerV1alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: the kubelet 1.34 to 1.36 stream."""

    def __init__(self, lists: HealthLists) -> None:
        self._lists = lists

    async def NodeWatchResources(
        self, request: v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[v1alpha1_pb2.NodeWatchResourcesResponse]:
        async for now, devices in self._lists.follow():
            yield _response(v1alpha1_pb2, now, devices)


def add_health_services(server: grpc.aio.Server, lists: HealthLists) -> None:
    """Serve every health version on ``server`` (a driver's DRAPlugin server)."""
    v1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicerV1(lists), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicerV1alpha1(lists), server)
