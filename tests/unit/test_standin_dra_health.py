"""The kubelet stand-in's DRA health manager (``standin/dra_health.py``) against a real health
service on a unix socket: a stream that ends is opened again every ``retry`` s, each failure an
event; each device's reported health, news only when it changes, in the pod's
``allocatedResourcesStatus`` (``Unknown`` when never said or too long ago)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from unixgrpc import channel_to
from waiting import eventually

from devicehost.proto.drahealth.v1 import api_pb2, api_pb2_grpc
from devicehost.standin.dra_health import HealthWatch, Reported, claim_status
from devicehost.standin.model import DraDevice, EventKind
from devicehost.standin.versions import HEALTH_V1

DRIVER = "example.com"


def health(device: str, status: int, message: str = "", timeout: int = 0) -> api_pb2.DeviceHealth:
    return api_pb2.DeviceHealth(
        device=api_pb2.DeviceIdentifier(pool_name="n/widget", device_name=device),
        health=status,  # type: ignore[arg-type]
        health_check_timeout_seconds=timeout,
        message=message,
    )


class Driver(api_pb2_grpc.DRAResourceHealthServicer):
    """A driver whose first stream ends at once; the next says w0 healthy, then w0 again
    (no news) and w1 unhealthy with a timeout of one second, and stays open."""

    def __init__(self) -> None:
        self.opened = 0

    async def NodeWatchResources(
        self, request: api_pb2.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[api_pb2.NodeWatchResourcesResponse]:
        self.opened += 1
        if self.opened == 1:
            return
        yield api_pb2.NodeWatchResourcesResponse(devices=[health("w0", api_pb2.HEALTHY)])
        yield api_pb2.NodeWatchResourcesResponse(
            devices=[health("w0", api_pb2.HEALTHY), health("w1", api_pb2.UNHEALTHY, "overheated", timeout=1)]
        )
        await asyncio.Event().wait()


async def test_a_stream_that_ends_is_opened_again_and_each_change_is_news() -> None:
    driver = Driver()
    server = grpc.aio.server()
    api_pb2_grpc.add_DRAResourceHealthServicer_to_server(driver, server)
    events: list[tuple[EventKind, str, str]] = []
    async with channel_to(server) as channel:
        watch = HealthWatch(DRIVER, channel, HEALTH_V1, lambda *e: events.append(e), retry=0.05)
        await eventually(lambda: len(events) == 3, "the failure and two changes said", within=10)
        await watch.stop()
    assert (driver.opened, watch.failures) == (2, 1)
    assert events == [
        (EventKind.HEALTH_FAILED, DRIVER, f"{HEALTH_V1}: stream ended"),
        (EventKind.HEALTH, DRIVER, "n/widget/w0: Healthy"),
        (EventKind.HEALTH, DRIVER, "n/widget/w1: Unhealthy"),  # w0 said again: no news
    ]
    devices = [DraDevice(("gpu",), "n/widget", name, (f"{DRIVER}/claim-u1={name}",)) for name in ("w0", "w1")]
    devices.append(DraDevice(("gpu",), "n/widget", "w2", ()))  # never reported, no CDI ID
    assert claim_status(DRIVER, "c1", devices, [watch]) == [
        {
            "name": "claim:c1/gpu",
            "resources": [
                {"resourceID": f"{DRIVER}/claim-u1=w0", "health": "Healthy"},
                {"resourceID": f"{DRIVER}/claim-u1=w1", "health": "Unhealthy", "message": "overheated"},
                {"resourceID": f"{DRIVER}/n/widget/w2", "health": "Unknown"},
            ],
        }
    ]


async def test_a_driver_without_the_service_is_tried_again_every_retry() -> None:
    server = grpc.aio.server()  # serves nothing
    events: list[tuple[EventKind, str, str]] = []
    async with channel_to(server) as channel:
        watch = HealthWatch(DRIVER, channel, HEALTH_V1, lambda *e: events.append(e), retry=0.05)
        await eventually(lambda: watch.failures >= 2, "tried again", within=10)
        await watch.stop()
    kind, driver, message = events[0]
    assert (kind, driver) == (EventKind.HEALTH_FAILED, DRIVER)
    assert message.startswith(f"{HEALTH_V1}: rpc error: code = UNIMPLEMENTED")


def test_a_health_older_than_its_timeout_reads_unknown() -> None:
    said = time.monotonic()
    assert Reported("Unhealthy", "overheated", said, timeout=30).now() == ("Unhealthy", "overheated")
    assert Reported("Unhealthy", "overheated", said - 31, timeout=30).now() == ("Unknown", "")
