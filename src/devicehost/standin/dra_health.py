"""The kubelet's DRA health manager: one ``NodeWatchResources`` stream per registered driver
endpoint, in the health API version of the kubelet's Kubernetes version, and each device's
health as the pod's ``allocatedResourcesStatus`` shows it.

Where the driver lacks the service, or the stream ends, the kubelet logs an error and opens it
again every 5 s (``RETRY``). A device's health older than its timeout (30 s unless the driver
says) reads ``Unknown``, as does a device never reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
import structlog

from devicehost.proto.drahealth.v1 import api_pb2 as v1_pb2
from devicehost.proto.drahealth.v1 import api_pb2_grpc as v1_grpc
from devicehost.proto.drahealth.v1alpha1 import api_pb2 as v1alpha1_pb2
from devicehost.proto.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from devicehost.standin.events import COMPONENT
from devicehost.standin.model import DraDevice, EventKind
from devicehost.standin.versions import HEALTH_V1, HEALTH_V1ALPHA1, KubernetesVersion

RETRY = 5.0
"""Seconds between tries to open the stream (the kubelet's)."""
DEFAULT_TIMEOUT = 30
"""Seconds a reported health holds without news (the kubelet's default)."""

_MODULES: dict[str, tuple[ModuleType, ModuleType]] = {
    HEALTH_V1: (v1_pb2, v1_grpc),
    HEALTH_V1ALPHA1: (v1alpha1_pb2, v1alpha1_grpc),
}
_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
ClaimRef = tuple[str, str, str]
"""(namespace, uid, name), as the kubelet names a claim."""


@dataclass(frozen=True)
class Reported:
    """One device's health as the driver last reported it."""

    health: str
    """``Healthy``, ``Unhealthy`` or ``Unknown``."""
    message: str
    at: float
    """``time.monotonic()`` when it arrived."""
    timeout: float

    def now(self) -> tuple[str, str]:
        """(health, message) now: ``Unknown`` once older than its timeout."""
        if time.monotonic() - self.at > self.timeout:
            return "Unknown", ""
        return self.health, self.message


class HealthWatch:
    """The stream to one driver endpoint, reopened every ``retry`` s; its devices' health."""

    def __init__(
        self,
        driver: str,
        channel: grpc.aio.Channel,
        service: str,
        on_event: Callable[[EventKind, str, str], None],
        retry: float = RETRY,
    ) -> None:
        self.driver = driver
        self.service = service
        self.devices: dict[tuple[str, str], Reported] = {}
        """By (pool, device)."""
        self.failures = 0
        """Tries to open the stream that failed or ended."""
        self._channel = channel
        self._on_event = on_event
        self._retry = retry
        self._log = structlog.get_logger("devicehost.kubelet").bind(component=COMPONENT, driver=driver)
        self._task = asyncio.create_task(self._run(), name=f"health {driver}")

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.wait([self._task])

    async def _run(self) -> None:
        pb2, pb2_grpc = _MODULES[self.service]
        while True:
            try:
                stream = pb2_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
                    pb2.NodeWatchResourcesRequest()
                )
                async for response in stream:
                    self._take(response)
                error = "stream ended"
            except grpc.aio.AioRpcError as exc:
                error = f"rpc error: code = {exc.code().name} desc = {exc.details()}"
            self.failures += 1
            self._log.error("failed to watch DRA resource health", service=self.service, error=error)
            self._on_event(EventKind.HEALTH_FAILED, self.driver, f"{self.service}: {error}")
            await asyncio.sleep(self._retry)

    def _take(self, response: object) -> None:
        now = time.monotonic()
        changed = []
        for d in getattr(response, "devices", ()):
            key = (d.device.pool_name, d.device.device_name)
            timeout = (
                d.health_check_timeout_seconds if d.health_check_timeout_seconds > 0 else DEFAULT_TIMEOUT
            )
            reported = Reported(_NAMES.get(d.health, "Unknown"), d.message, now, timeout)
            old = self.devices.get(key)
            if old is None or (old.health, old.message) != (reported.health, reported.message):
                changed.append(f"{key[0]}/{key[1]}: {reported.health}")
            self.devices[key] = reported
        if changed:
            self._on_event(EventKind.HEALTH, self.driver, ", ".join(changed))


class DraHealth:
    """The kubelet's health side of DRA: a :class:`HealthWatch` per registered endpoint where its
    ``version`` opens one (tried again every ``retry`` s), the prepared claims, and the pod
    status they make."""

    def __init__(self, emit: Callable[[EventKind, str, str], None], version: KubernetesVersion) -> None:
        self.version = version
        self.retry = RETRY
        self._emit = emit
        self._watches: dict[str, HealthWatch] = {}
        """By endpoint."""
        self._prepared: dict[str, tuple[str, str, tuple[DraDevice, ...]]] = {}
        """Prepared claims by UID: their driver, name and devices."""

    def watch(self, driver: str, endpoint: str, channel: grpc.aio.Channel) -> None:
        """Open the version's health stream to a newly registered endpoint (if it has one)."""
        service = self.version.health_service
        if service is not None:
            self._watches[endpoint] = HealthWatch(driver, channel, service, self._emit, self.retry)

    async def stop(self, endpoint: str) -> None:
        """Close the stream of an endpoint that went away."""
        watch = self._watches.pop(endpoint, None)
        if watch is not None:
            await watch.stop()

    async def stop_all(self) -> None:
        for endpoint in list(self._watches):
            await self.stop(endpoint)

    def prepared(
        self, driver: str, claims: Sequence[ClaimRef], devices: Mapping[str, tuple[DraDevice, ...]]
    ) -> None:
        self._prepared.update({uid: (driver, name, devices[uid]) for _, uid, name in claims})

    def unprepared(self, claims: Sequence[ClaimRef]) -> None:
        for _, uid, _ in claims:
            self._prepared.pop(uid, None)

    def allocated_resources_status(self, claims: Sequence[ClaimRef]) -> list[dict[str, Any]]:
        """The pod status's ``allocatedResourcesStatus`` for a pod of the prepared ``claims``."""
        found = []
        for _, uid, _ in claims:
            driver, name, devices = self._prepared[uid]
            watches = [w for w in self._watches.values() if w.driver == driver]
            found += claim_status(driver, name, devices, watches)
        return found


def claim_status(
    driver: str, claim: str, devices: Sequence[DraDevice], watches: Sequence[HealthWatch]
) -> list[dict[str, Any]]:
    """A prepared claim's entries of a pod's ``allocatedResourcesStatus``: per request, each
    device's health as the driver's streams last said it (``Unknown`` when they said nothing,
    or too long ago), with the driver's message, under each CDI ID the driver answered for it
    (as a 1.35 kubelet was seen naming it; ``<driver>/<pool>/<device>`` for a device without)."""
    reported: dict[tuple[str, str], Reported] = {}
    for watch in watches:
        reported |= watch.devices
    statuses: dict[str, list[dict[str, str]]] = {}
    for device in devices:
        found = reported.get((device.pool, device.device))
        health, message = found.now() if found else ("Unknown", "")
        for resource in device.cdi_ids or (f"{driver}/{device.pool}/{device.device}",):
            entry = {"resourceID": resource, "health": health} | ({"message": message} if message else {})
            for request in device.requests:
                statuses.setdefault(f"claim:{claim}/{request}", []).append(entry)
    return [{"name": key, "resources": value} for key, value in statuses.items()]
