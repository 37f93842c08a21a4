"""The baseline: a bare grpc.aio DevicePlugin servicer process, with no host in between.

``python -m benchmarks.bare_server --dir DIR --resources name=16,...`` serves each resource on
its own socket, registers it with ``kubelet.sock``, and answers Allocate with exactly what the
example backend answers. It re-serves and re-registers when ``kubelet.sock`` is recreated (inotify).
A line ``push <resource> <Healthy|Unhealthy>`` on stdin sets device 0's health from a thread, as
a backend's watcher would, and prints the ``time.monotonic()`` of the change; a line ``tasks``
prints how many asyncio tasks the server's loop holds (:func:`count_tasks`); EOF stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from asyncinotify import Inotify, Mask

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

KUBELET_SOCKET = "kubelet.sock"
RETRY_INITIAL = 0.02
RETRY_MAX = 5.0
"""Seconds before a failed Register is tried again, doubling up to the cap (the host's backoff)."""
Context = grpc.aio.ServicerContext[Any, Any]


def parse_resources(text: str) -> dict[str, int]:
    """``name=count,name=count`` (the example backend's env format)."""
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {name.strip(): int(count) for name, _, count in pairs}


class BareServicer(api_pb2_grpc.DevicePluginServicer):
    """One resource: a fixed device list, device 0's health settable, Allocate as the example backend."""

    def __init__(self, resource: str, count: int) -> None:
        self.resource = resource
        self.short = resource.split("/")[1]
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)])
        self.devices = [
            api_pb2.Device(ID=f"{self.short}-{n}", health="Healthy", topology=topology) for n in range(count)
        ]
        self.env = f"EXAMPLE_{self.short.upper().replace('-', '_').replace('.', '_')}S"
        self._changed = asyncio.Event()

    def set_health(self, health: str) -> None:
        self.devices[0].health = health
        self._changed.set()
        self._changed = asyncio.Event()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        while True:
            changed = self._changed
            yield api_pb2.ListAndWatchResponse(devices=self.devices)
            await changed.wait()

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs={self.env: ",".join(ids)},
                    mounts=[api_pb2.Mount(container_path="/etc/example", host_path="/etc", read_only=True)],
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path=f"/dev/{i}", host_path="/dev/null", permissions="rw"
                        )
                        for i in ids
                    ],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)


class BarePlugin:
    """Every resource's server, registered with the kubelet again whenever it restarts."""

    def __init__(self, directory: Path, resources: dict[str, int]) -> None:
        self.directory = directory
        self.servicers = {name: BareServicer(name, count) for name, count in resources.items()}
        self._servers: dict[str, grpc.aio.Server] = {}

    def endpoint(self, name: str) -> str:
        return f"bare-{name.replace('/', '_')}.sock"

    async def serve_and_register(self) -> None:
        """Serve every resource afresh and register each. A failed Register (the kubelet restarted
        under it) is tried again with backoff, as the host does, rather than ending the process's
        following of ``kubelet.sock``."""
        await asyncio.gather(*(self._serve(name) for name in self.servicers))
        pending, delay = list(self.servicers), RETRY_INITIAL
        while pending := await self._register(pending):
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX)

    async def _register(self, names: list[str]) -> list[str]:
        """Register ``names`` with the kubelet; those whose Register failed."""
        options = [("grpc.default_authority", "localhost")]
        async with grpc.aio.insecure_channel(f"unix://{self.directory / KUBELET_SOCKET}", options) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            results = await asyncio.gather(
                *(
                    stub.Register(
                        api_pb2.RegisterRequest(
                            version="v1beta1", endpoint=self.endpoint(name), resource_name=name
                        ),
                        timeout=10,
                    )
                    for name in names
                ),
                return_exceptions=True,
            )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, grpc.aio.AioRpcError):
                raise result
        return [
            name for name, result in zip(names, results, strict=True) if isinstance(result, BaseException)
        ]

    async def _serve(self, name: str) -> None:
        old = self._servers.pop(name, None)
        if old is not None:
            await old.stop(0)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicers[name], server)
        path = self.directory / self.endpoint(name)
        path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        self._servers[name] = server

    async def follow_kubelet(self) -> None:
        """Serve and register again each time ``kubelet.sock`` is created."""
        with Inotify() as inotify:
            inotify.add_watch(self.directory, Mask.CREATE)
            await self.serve_and_register()
            async for event in inotify:
                if event.name is not None and str(event.name) == KUBELET_SOCKET:
                    await self.serve_and_register()

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop(0) for server in self._servers.values()))


async def _tasks_now() -> int:
    return len(asyncio.all_tasks()) - 1  # not this one


def count_tasks(loop: asyncio.AbstractEventLoop) -> int:
    """From another thread: the tasks ``loop`` holds, counted on the loop itself."""
    return asyncio.run_coroutine_threadsafe(_tasks_now(), loop).result()


def read_commands(loop: asyncio.AbstractEventLoop, plugin: BarePlugin, done: asyncio.Event) -> None:
    """Stdin reader thread: ``push`` lines change health through the loop, ``tasks`` counts the
    loop's tasks; EOF ends the process."""
    for line in sys.stdin:
        if line.strip() == "tasks":
            print(count_tasks(loop), flush=True)
            continue
        _, resource, health = line.split()
        changed = time.monotonic()
        loop.call_soon_threadsafe(plugin.servicers[resource].set_health, health)
        print(changed, flush=True)
    loop.call_soon_threadsafe(done.set)


async def main(directory: Path, resources: dict[str, int]) -> None:
    plugin = BarePlugin(directory, resources)
    done = asyncio.Event()
    threading.Thread(
        target=read_commands, args=(asyncio.get_running_loop(), plugin, done), daemon=True
    ).start()
    follow = asyncio.create_task(plugin.follow_kubelet())
    await done.wait()
    follow.cancel()
    await plugin.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--resources", type=parse_resources, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.dir, args.resources))
