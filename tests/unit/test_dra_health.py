"""The DRA health stream, in each version the kubelet speaks (v1alpha1, v1): the whole list at
once, after each change, and again before the kubelet's 30 s health timeout would read the
devices as Unknown; an unhealthy device carries the backend's message."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from devicehost.host.dra.driver import Changes
from devicehost.host.dra.health import HealthLists, add_health_services
from devicehost.proto.drahealth.v1 import api_pb2 as v1_pb2
from devicehost.proto.drahealth.v1 import api_pb2_grpc as v1_grpc
from devicehost.proto.drahealth.v1alpha1 import api_pb2 as v1alpha1_pb2
from devicehost.proto.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc


@pytest.mark.parametrize(
    ("pb2", "pb2_grpc"), [(v1_pb2, v1_grpc), (v1alpha1_pb2, v1alpha1_grpc)], ids=["v1", "v1alpha1"]
)
async def test_health_is_sent_at_once_on_change_and_again_without_one(
    pb2: ModuleType, pb2_grpc: ModuleType
) -> None:
    healthy = {"d0": (True, "")}
    changes = Changes()
    lists = HealthLists(lambda: [("p", n, h, m) for n, (h, m) in healthy.items()], changes.wait, refresh=0.2)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        server = grpc.aio.server()
        add_health_services(server, lists)
        server.add_insecure_port(f"unix:{Path(tmp) / 'h.sock'}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{Path(tmp) / 'h.sock'}") as channel:
                stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    pb2.NodeWatchResourcesRequest()
                )
                first = await asyncio.wait_for(stream.read(), 0.1)  # at once, no change needed
                assert [(d.device.device_name, d.health) for d in first.devices] == [("d0", pb2.HEALTHY)]
                healthy["d0"] = (False, "ECC errors over the limit")
                changes.bump()
                changed = await asyncio.wait_for(stream.read(), 0.1)  # at once after a change
                assert (changed.devices[0].health, changed.devices[0].message) == (
                    pb2.UNHEALTHY,
                    "ECC errors over the limit",
                )
                loop = asyncio.get_running_loop()
                started = loop.time()
                again = await asyncio.wait_for(stream.read(), 2)  # no change: sent after refresh
                assert 0.15 < loop.time() - started < 1.5
                assert again.devices[0].health == pb2.UNHEALTHY
                stream.cancel()
        finally:
            await server.stop(None)
