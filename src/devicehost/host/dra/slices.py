"""A resource's devices as a ResourceSlice (``resource.k8s.io/v1``), built as a plain dict.

Only healthy devices are published: the v1 API has no health field, and device taints are still
alpha (``DRADeviceTaints``) in 1.35, so an unhealthy device is withdrawn from the slice and comes
back when it is healthy again. Devices held for a claim stay published (the scheduler already
counts them allocated).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from devicehost.hookspecs.types import Device, Health, Version
from devicehost.host.dra.cluster import SLICE_API_VERSION
from devicehost.host.dra.names import device_name


def device_entry(device: Device) -> dict[str, Any]:
    """One device of a slice: its name, its attributes (the built-in ones first) and capacity."""
    attributes: dict[str, dict[str, Any]] = {"id": {"string": device.id}}
    if len(device.numa_nodes) == 1:
        attributes["numaNode"] = {"int": device.numa_nodes[0]}
    if device.group is not None:
        attributes["group"] = {"string": device.group}
    for name, value in device.attributes.items():
        attributes[name] = {_attribute_kind(value): str(value) if isinstance(value, Version) else value}
    entry: dict[str, Any] = {"name": device_name(device.id), "attributes": attributes}
    if device.capacity:
        entry["capacity"] = {name: {"value": str(value)} for name, value in device.capacity.items()}
    return entry


def _attribute_kind(value: bool | int | str) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return "version" if isinstance(value, Version) else "string"


def slice_spec(node: str, driver: str, pool: str, devices: Iterable[Device]) -> dict[str, Any]:
    """The ``spec`` of the one slice of ``pool``: its healthy devices, in the order given (the
    pool's generation is the publisher's to set)."""
    return {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool, "resourceSliceCount": 1},
        "devices": [device_entry(d) for d in devices if d.health is Health.HEALTHY],
    }


def slice_body(
    name: str, owner: tuple[str, str], spec: dict[str, Any], resource_version: str = ""
) -> dict[str, Any]:
    """A whole ResourceSlice object, owned by the Node ``owner`` = (name, uid)."""
    metadata: dict[str, Any] = {
        "name": name,
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": owner[0], "uid": owner[1], "controller": True}
        ],
        "labels": {"app.kubernetes.io/managed-by": "devicehost"},
    }
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": SLICE_API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}


def same_devices(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two specs publish the same thing, whatever their pool generations."""
    return _without_generation(a) == _without_generation(b)


def _without_generation(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "pool": {**spec.get("pool", {}), "generation": 0}}
