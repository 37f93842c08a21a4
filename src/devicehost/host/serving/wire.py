"""Conversions between the backend dataclasses and the v1beta1 wire messages.

The only place that turns one into the other, so backends never see protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable

from devicehost.hookspecs.types import ContainerAllocation, Device, Health
from devicehost.proto.deviceplugin.v1beta1 import api_pb2


def device(d: Device) -> api_pb2.Device:
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in d.numa_nodes]) if d.numa_nodes else None
    )
    return api_pb2.Device(ID=d.id, health=Health(d.health).value, topology=topology)


def device_list(devices: Iterable[Device]) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(devices=[device(d) for d in devices])


def container_allocation(a: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(a.envs),
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in a.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=s.container_path, host_path=s.host_path, permissions=s.permissions
            )
            for s in a.devices
        ],
        annotations=dict(a.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in a.cdi_devices],
    )
