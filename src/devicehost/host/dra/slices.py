"""A resource's devices as the ResourceSlices of one pool (``resource.k8s.io/v1``), built as plain dicts.

A slice holds at most :data:`MAX_DEVICES` devices, so a resource with more is published over as
many slices as it needs, all of one pool. :class:`Placement` says which slice each device is in,
and keeps it there while the device exists, so one device changing rewrites one slice.

The v1 API has no health field. Where the API server keeps device taints (``DRADeviceTaints``,
alpha in 1.35) an unhealthy device stays published with a taint (``devicehost.io/unhealthy``,
``NoSchedule`` unless the operator says otherwise) and loses it when it recovers; elsewhere it is
withdrawn from the slice and comes back when it is healthy again. Devices held for a claim stay
published (the scheduler already counts them allocated); devices the caller withdraws (held
through the device plugin API, or left without counters by it) keep their place in the pool
while they are gone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from devicehost.hookspecs.types import Capacity, Device, Health, Version
from devicehost.host.dra.cluster import SLICE_API_VERSION
from devicehost.host.dra.names import device_name
from devicehost.host.dra.pci import pcie_root
from devicehost.resourceapi import UNHEALTHY_TAINT

STANDARD = "resource.kubernetes.io/"
"""The domain of the device attributes Kubernetes standardised."""
MAX_DEVICES = 128
"""Devices one ResourceSlice may hold (``resource.k8s.io/v1`` refuses more)."""
MAX_CONSUMING_DEVICES = 64
"""Devices one ResourceSlice may hold when any of them consumes shared counters (or has taints)."""


def device_entry(device: Device) -> dict[str, Any]:
    """One device of a slice: its name, its attributes (the built-in ones first) and capacity."""
    attributes: dict[str, dict[str, Any]] = {"id": {"string": device.id}}
    if len(device.numa_nodes) == 1:
        attributes["numaNode"] = {"int": device.numa_nodes[0]}
    if device.group is not None:
        attributes["group"] = {"string": device.group}
    for name, value in device.attributes.items():
        attributes[name] = {_attribute_kind(value): str(value) if isinstance(value, Version) else value}
    attributes |= standard_attributes(device)
    entry: dict[str, Any] = {"name": device_name(device.id), "attributes": attributes}
    if device.capacity:
        entry["capacity"] = {name: capacity_entry(value) for name, value in device.capacity.items()}
    if device.allow_multiple_allocations:
        entry["allowMultipleAllocations"] = True
    if device.consumes:
        entry["consumesCounters"] = [
            {"counterSet": name, "counters": _counters(counters)}
            for name, counters in device.consumes.items()
        ]
    # -- binding conditions --
    if device.binding_conditions:
        entry["bindingConditions"] = list(device.binding_conditions)
        entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
    # -- end binding conditions --
    return entry


def standard_attributes(device: Device) -> dict[str, dict[str, Any]]:
    """The attributes Kubernetes standardised (``resource.kubernetes.io/``) that the host knows:
    the device's one NUMA node, its PCI address and the PCIe root complex sysfs gives it."""
    found: dict[str, dict[str, Any]] = {}
    if len(device.numa_nodes) == 1:
        found[STANDARD + "numaNode"] = {"int": device.numa_nodes[0]}
    if device.pci_bus_id:
        found[STANDARD + "pciBusID"] = {"string": device.pci_bus_id}
        root = pcie_root(device.pci_bus_id)
        if root:
            found[STANDARD + "pcieRoot"] = {"string": root}
    return found


def capacity_entry(capacity: int | str | Capacity) -> dict[str, Any]:
    """One capacity of a device: its value, and its request policy where it has one."""
    if not isinstance(capacity, Capacity):
        return {"value": str(capacity)}
    entry: dict[str, Any] = {"value": str(capacity.value)}
    if not capacity.has_policy:
        return entry
    policy: dict[str, Any] = {} if capacity.default is None else {"default": str(capacity.default)}
    if capacity.valid_values:
        policy["validValues"] = [str(v) for v in capacity.valid_values]
    elif capacity.min is not None:
        bounds = {"min": capacity.min, "max": capacity.max, "step": capacity.step}
        policy["validRange"] = {key: str(v) for key, v in bounds.items() if v is not None}
    entry["requestPolicy"] = policy
    return entry


def _counters(counters: Mapping[str, int | str]) -> dict[str, dict[str, str]]:
    return {name: {"value": str(value)} for name, value in counters.items()}


def counter_spec(
    node: str, driver: str, pool: str, counter_sets: Mapping[str, Mapping[str, int | str]], slice_count: int
) -> dict[str, Any]:
    """The ``spec`` of the slice of ``pool`` that holds its shared counter sets and no devices
    (``resource.k8s.io/v1`` keeps the two in separate slices of one pool)."""
    return {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool, "resourceSliceCount": slice_count},
        "sharedCounters": [
            {"name": name, "counters": _counters(counters)} for name, counters in sorted(counter_sets.items())
        ],
    }


def _attribute_kind(value: bool | int | str) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return "version" if isinstance(value, Version) else "string"


def slice_spec(
    node: str,
    driver: str,
    pool: str,
    devices: Iterable[Device],
    slice_count: int = 1,
    taints: Mapping[str, Mapping[str, str]] | None = None,
    withdrawn: Collection[str] = (),
) -> dict[str, Any]:
    """The ``spec`` of one slice of ``pool`` (of ``slice_count`` slices): its healthy devices, in
    the order given (the pool's generation is the publisher's to set). With ``taints`` (device ID
    -> its taint, for every unhealthy device) the unhealthy ones stay, each with its taint. Devices
    in ``withdrawn`` are left out, whatever their health."""
    entries = []
    for device in devices:
        if device.id in withdrawn:
            continue
        if device.health is Health.HEALTHY:
            entries.append(device_entry(device))
        elif taints is not None:
            entries.append({**device_entry(device), "taints": [dict(taints[device.id])]})
    return {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool, "resourceSliceCount": slice_count},
        "devices": entries,
    }


def unhealthy_taint(effect: str, since: str) -> dict[str, str]:
    """The taint of a device its backend reports unhealthy, added at ``since`` (RFC 3339)."""
    return {"key": UNHEALTHY_TAINT, "value": "true", "effect": effect, "timeAdded": since}


class Placement:
    """Which slice of its pool each device of one resource is in.

    A device keeps its slice while it exists, healthy or not (an unhealthy one keeps its place
    while it is withdrawn), so a device appearing, going or changing rewrites its own slice only.
    A new device takes the first slice with room. The pool has as many slices as its devices
    need, ``ceil(devices / per_slice)``, at least one; when devices go and fewer slices would do,
    the devices of the slices that go move into the room left in the others (every slice is
    rewritten then anyway: each carries the pool's slice count).
    """

    def __init__(self, per_slice: int = MAX_DEVICES) -> None:
        self.per_slice = per_slice
        self.slot: dict[str, int] = {}
        """Device ID -> index of its slice."""
        self.count = 1
        """Slices in the pool at the last :meth:`place`."""

    def resize(self, per_slice: int) -> None:
        """Hold at most ``per_slice`` devices a slice from now on (every device placed anew when it changes)."""
        if per_slice != self.per_slice:
            self.per_slice, self.slot = per_slice, {}

    def place(self, device_ids: Sequence[str]) -> list[list[str]]:
        """The device IDs of each slice, in the order given; remembered for the next call."""
        present = set(device_ids)
        count = max(1, math.ceil(len(present) / self.per_slice))
        slot = {d: s for d, s in self.slot.items() if d in present and s < count}
        used = Counter(slot.values())
        free = 0
        for device in device_ids:
            if device in slot:
                continue
            while used[free] >= self.per_slice:
                free += 1
            slot[device] = free
            used[free] += 1
        self.slot, self.count = slot, count
        slices: list[list[str]] = [[] for _ in range(count)]
        for device in dict.fromkeys(device_ids):
            slices[slot[device]].append(device)
        return slices


def pool_specs(
    node: str,
    driver: str,
    pool: str,
    devices: Sequence[Device],
    placement: Placement,
    counter_sets: Mapping[str, Mapping[str, int | str]] | None = None,
    taints: Mapping[str, Mapping[str, str]] | None = None,
    withdrawn: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The ``spec`` of each slice of ``pool``, first to last, as ``placement`` places ``devices``
    (those in ``withdrawn`` keep their place, left out); with ``counter_sets``, one more slice
    holding them comes last. Devices that consume counters, or may carry taints (``taints``
    given), go at most :data:`MAX_CONSUMING_DEVICES` to a slice."""
    limited = taints is not None or any(d.consumes for d in devices)
    placement.resize(MAX_CONSUMING_DEVICES if limited else MAX_DEVICES)
    by_id = {d.id: d for d in devices}
    slices = placement.place([d.id for d in devices])
    count = len(slices) + (1 if counter_sets else 0)
    specs = [
        slice_spec(node, driver, pool, [by_id[i] for i in ids], count, taints, withdrawn) for ids in slices
    ]
    if counter_sets:
        specs.append(counter_spec(node, driver, pool, counter_sets, count))
    return specs


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
