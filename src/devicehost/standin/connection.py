"""The kubelet's client for one plugin socket: dial, GetDevicePluginOptions, one ListAndWatch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

# The kubelet dials with authority "localhost", not the socket path.
CHANNEL_OPTIONS = [("grpc.default_authority", "localhost")]


class ConnectError(Exception):
    """Dialling the plugin or asking for its options failed (kubelet wording)."""


class PluginConnection:
    """One plugin endpoint as the kubelet holds it; the stream is read once and never retried."""

    def __init__(
        self,
        resource: str,
        socket_path: str,
        on_list: Callable[[PluginConnection, api_pb2.ListAndWatchResponse], None],
        on_end: Callable[[PluginConnection, str], None],
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.closing = False
        self._on_list = on_list
        self._on_end = on_end
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}", options=CHANNEL_OPTIONS)
        self.stub = api_pb2_grpc.DevicePluginStub(self._channel)
        self._call: grpc.aio.UnaryStreamCall[api_pb2.Empty, api_pb2.ListAndWatchResponse] | None = None
        self._task: asyncio.Task[None] | None = None

    async def connect(self, dial_timeout: float) -> api_pb2.DevicePluginOptions:
        """Wait until the socket accepts (as the kubelet's blocking dial), then get the options."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), dial_timeout)
        except TimeoutError as exc:
            raise ConnectError(
                f"failed to dial device plugin: {self.socket_path}: context deadline exceeded"
            ) from exc
        try:
            return await self.stub.GetDevicePluginOptions(api_pb2.Empty())
        except grpc.aio.AioRpcError as exc:
            raise ConnectError(f"failed to get device plugin options: {exc.details()}") from exc

    def start_stream(self) -> None:
        """Open ListAndWatch and read it in a task until it ends."""
        self._call = self.stub.ListAndWatch(api_pb2.Empty())
        self._task = asyncio.create_task(self._consume(self._call), name=f"ListAndWatch {self.resource}")

    def drop(self) -> None:
        """Cancel the stream from the kubelet side; ``on_end`` reports it like any other end."""
        if self._call is not None:
            self._call.cancel()

    async def close(self) -> None:
        """End the stream and the channel on purpose (``closing`` is set when ``on_end`` runs)."""
        self.closing = True
        if self._call is None or self._task is None:
            await self._channel.close(None)
            return
        self._call.cancel()
        await self._task

    async def _consume(
        self, call: grpc.aio.UnaryStreamCall[api_pb2.Empty, api_pb2.ListAndWatchResponse]
    ) -> None:
        reason = "ListAndWatch ended by the plugin"
        try:
            async for response in call:
                self._on_list(self, response)
        except grpc.aio.AioRpcError as exc:
            reason = f"ListAndWatch failed: {exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            reason = "ListAndWatch cancelled by the kubelet"
        await self._channel.close(None)
        self._on_end(self, reason)
