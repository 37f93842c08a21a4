"""The DRA health stream: the whole list at once, after each change, and again before the
kubelet's 30 s health timeout would read the devices as Unknown."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc

from devicehost.host.dra.driver import Changes
from devicehost.host.dra.servicer import DraHealthServicer
from devicehost.proto.drahealth.v1alpha1 import api_pb2, api_pb2_grpc


async def test_health_is_sent_at_once_on_change_and_again_without_one() -> None:
    healthy = {"d0": True}
    changes = Changes()
    servicer = DraHealthServicer(lambda: [("p", n, h) for n, h in healthy.items()], changes.wait, refresh=0.2)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        server = grpc.aio.server()
        api_pb2_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix:{Path(tmp) / 'h.sock'}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{Path(tmp) / 'h.sock'}") as channel:
                stream = api_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    api_pb2.NodeWatchResourcesRequest()
                )
                first = await asyncio.wait_for(stream.read(), 0.1)  # at once, no change needed
                assert [(d.device.device_name, d.health) for d in first.devices] == [("d0", api_pb2.HEALTHY)]
                healthy["d0"] = False
                changes.bump()
                changed = await asyncio.wait_for(stream.read(), 0.1)  # at once after a change
                assert changed.devices[0].health == api_pb2.UNHEALTHY
                loop = asyncio.get_running_loop()
                started = loop.time()
                again = await asyncio.wait_for(stream.read(), 2)  # no change: sent after refresh
                assert 0.15 < loop.time() - started < 1.5
                assert again.devices[0].health == api_pb2.UNHEALTHY
                stream.cancel()
        finally:
            await server.stop(None)
