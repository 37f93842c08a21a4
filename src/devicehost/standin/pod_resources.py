"""The stand-in's pod-resources API: which container of which pod holds which device.

:class:`PodAssignments` is fed by the stand-in's own admissions and releases; every change
rewrites the checkpoint file in the device-plugins dir (atomically, as the kubelet's checkpoint
manager does: a temporary file renamed over it). :class:`PodResourcesServer` serves
``v1.PodResourcesLister`` (``List``, ``GetAllocatableResources``, ``Get``) from them on its own
socket, as the kubelet does on ``pod-resources/kubelet.sock``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc

from devicehost.proto.podresources.v1 import api_pb2, api_pb2_grpc

Context = grpc.aio.ServicerContext[object, object]
PodKey = tuple[str, str]
"""(namespace, pod name)."""
Containers = dict[str, dict[str, list[str]]]
"""Container name to resource name to device IDs."""


class PodAssignments:
    """Devices assigned to the containers of running pods; ``on_change`` runs after each change."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, Containers] = {}
        self.on_change: Callable[[], None] = lambda: None

    def assign(self, pod: PodKey, container: str, resource: str, device_ids: Sequence[str]) -> None:
        """Record an admitted container's devices."""
        held = self.pods.setdefault(pod, {}).setdefault(container, {}).setdefault(resource, [])
        held.extend(i for i in device_ids if i not in held)
        self.on_change()

    def remove_pod(self, pod: PodKey) -> dict[str, list[str]]:
        """Forget a pod that ended; its devices by resource (empty when it was not known)."""
        freed: dict[str, list[str]] = {}
        for resources in self.pods.pop(pod, {}).values():
            for resource, ids in resources.items():
                freed.setdefault(resource, []).extend(ids)
        self.on_change()
        return freed

    def remove_devices(self, resource: str, device_ids: Sequence[str] | None) -> None:
        """Forget devices of ``resource`` (all by default), and pods left with none."""
        for pod, containers in list(self.pods.items()):
            for resources in containers.values():
                if resource in resources:
                    kept = [i for i in resources[resource] if device_ids is not None and i not in device_ids]
                    resources[resource] = kept
            if not any(ids for resources in containers.values() for ids in resources.values()):
                del self.pods[pod]
        self.on_change()

    def pod_message(self, pod: PodKey) -> api_pb2.PodResources:
        """One pod as the pod-resources API describes it."""
        return api_pb2.PodResources(
            namespace=pod[0],
            name=pod[1],
            containers=[
                api_pb2.ContainerResources(
                    name=container,
                    devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                        for resource, ids in sorted(resources.items())
                        if ids
                    ],
                )
                for container, resources in sorted(self.pods[pod].items())
            ],
        )

    def checkpoint(self) -> dict[str, object]:
        """The checkpoint's content: the pod device entries (the shape, not the kubelet's checksum)."""
        entries = [
            {"PodUID": f"{ns}/{name}", "ContainerName": c, "ResourceName": r, "DeviceIDs": ids}
            for (ns, name), containers in sorted(self.pods.items())
            for c, resources in sorted(containers.items())
            for r, ids in sorted(resources.items())
        ]
        return {"Data": {"PodDeviceEntries": entries}}


def write_checkpoint(path: Path, assignments: PodAssignments) -> None:
    """Write the checkpoint as the kubelet does: a temporary file, then a rename over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(assignments.checkpoint()))
    os.replace(tmp, path)


class PodResourcesServer(api_pb2_grpc.PodResourcesListerServicer):
    """``v1.PodResourcesLister`` over :class:`PodAssignments`."""

    def __init__(
        self, assignments: PodAssignments, allocatable: Callable[[], Mapping[str, Sequence[str]]]
    ) -> None:
        self._assignments = assignments
        self._allocatable = allocatable
        self._server: grpc.aio.Server | None = None
        self.lists = 0
        """List calls answered."""

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: Context
    ) -> api_pb2.ListPodResourcesResponse:
        self.lists += 1
        pods = sorted(self._assignments.pods)
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[self._assignments.pod_message(p) for p in pods]
        )

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: Context
    ) -> api_pb2.AllocatableResourcesResponse:
        devices = [
            api_pb2.ContainerDevices(resource_name=name, device_ids=list(ids))
            for name, ids in sorted(self._allocatable().items())
        ]
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: Context
    ) -> api_pb2.GetPodResourcesResponse:
        pod = (request.pod_namespace, request.pod_name)
        if pod not in self._assignments.pods:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found in {request.pod_namespace}"
            )
        return api_pb2.GetPodResourcesResponse(pod_resources=self._assignments.pod_message(pod))

    async def serve(self, socket: Path) -> None:
        """Serve on ``socket`` (a stale file there is replaced)."""
        _make_room(socket)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        self._server = server

    async def stop(self, socket: Path) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        _remove(socket)


def _make_room(socket: Path) -> None:
    """The socket's dir exists and nothing is at its path."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    _remove(socket)


def _remove(socket: Path) -> None:
    socket.unlink(missing_ok=True)
