"""The plugin-watcher registration path: ``pluginregistration.Registration`` on the resource socket.

In plugin-watcher mode a resource's socket lives in the kubelet's ``plugins_registry`` dir and serves
this service next to DevicePlugin: the kubelet's plugin watcher sees the socket appear, asks
``GetInfo`` (the endpoint is this same socket), dials it, and reports the outcome with
``NotifyRegistrationStatus``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from devicehost.host.kubelet.client import API_VERSION
from devicehost.proto.pluginregistration.v1 import api_pb2, api_pb2_grpc

PLUGIN_TYPE = "DevicePlugin"


class PluginRegistrationServicer(api_pb2_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher for one resource, or one DRA driver (``DRAPlugin``)."""

    def __init__(
        self,
        resource: str,
        endpoint: Callable[[], str],
        on_status: Callable[[bool, str], None],
        *,
        plugin_type: str = PLUGIN_TYPE,
        versions: Sequence[str] = (API_VERSION,),
    ) -> None:
        self._resource = resource
        self._endpoint = endpoint
        self._on_status = on_status
        self._type = plugin_type
        self._versions = list(versions)

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PluginInfo:
        return api_pb2.PluginInfo(
            type=self._type, name=self._resource, endpoint=self._endpoint(), supported_versions=self._versions
        )

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.RegistrationStatusResponse:
        self._on_status(request.plugin_registered, request.error)
        return api_pb2.RegistrationStatusResponse()
