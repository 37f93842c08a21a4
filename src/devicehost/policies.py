"""Allocation policies: pure answers to the kubelet's preferred-allocation question.

Each policy takes the resource's devices (:class:`~devicehost.Device`: ID, NUMA nodes, and
``group``, the physical device a replica belongs to) and a
:class:`~devicehost.PreferredAllocationRequest`, and returns ``request.size`` distinct IDs from
``request.available``, every ``request.must_include`` among them (first, in their order). The
answer depends only on the inputs, never on the order of ``available``:

- ``numa-pack``: the fewest NUMA nodes, then the lowest IDs (IDs compare with their numbers as
  numbers: ``g2`` before ``g10``).
- ``spread``: across NUMA nodes first, then across physical devices, then the lowest IDs.
- ``replica-spread``: distinct physical devices first (replicas of one device share it), then
  the lowest IDs.

The host answers with one of them for a resource whose backend has no
``devicehost_preferred_allocation`` (config ``preferred_allocation``); a backend may call them
from its own hook::

    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, resource, request):
        return devicehost.policies.numa_pack(self.devices[resource], request)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

from devicehost.hookspecs.types import Device, PreferredAllocationRequest

__all__ = ["POLICIES", "Policy", "choose", "group_of", "id_key", "numa_pack", "replica_spread", "spread"]

Policy = Callable[[Sequence[Device], PreferredAllocationRequest], tuple[str, ...]]


def id_key(device_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of an ID: digit runs compare as numbers, so ``g2`` comes before ``g10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", device_id) if part
    )


def _setup(
    devices: Sequence[Device], request: PreferredAllocationRequest
) -> tuple[list[str], list[str], dict[str, Device], int]:
    """(must, candidates sorted by ID, devices by ID, how many more to pick)."""
    by_id = {d.id: d for d in devices}
    for device_id in (*request.available, *request.must_include):
        by_id.setdefault(device_id, Device(device_id))
    must = [i for i in dict.fromkeys(request.must_include) if i in set(request.available)]
    candidates = sorted(set(request.available) - set(must), key=id_key)
    return must, candidates, by_id, max(request.size - len(must), 0)


def group_of(device: Device) -> str:
    """The physical device ``device`` is part of (itself when it has no group)."""
    return device.group if device.group is not None else device.id


def _numa_of(device: Device) -> int:
    return min(device.numa_nodes) if device.numa_nodes else -1


def _balanced(
    devices: Sequence[Device],
    request: PreferredAllocationRequest,
    keys: Sequence[Callable[[Device], Hashable]],
) -> tuple[str, ...]:
    """Pick one device at a time: the one whose ``keys`` values were chosen least, then lowest ID."""
    must, candidates, by_id, need = _setup(devices, request)
    counts: list[Counter[Hashable]] = [Counter(key(by_id[i]) for i in must) for key in keys]
    chosen = list(must)
    left = list(candidates)
    for _ in range(min(need, len(left))):
        pick = min(
            left,
            key=lambda i: (*(c[k(by_id[i])] for c, k in zip(counts, keys, strict=True)), id_key(i)),
        )
        left.remove(pick)
        chosen.append(pick)
        for counter, key in zip(counts, keys, strict=True):
            counter[key(by_id[pick])] += 1
    return tuple(chosen)


def spread(devices: Sequence[Device], request: PreferredAllocationRequest) -> tuple[str, ...]:
    """Across NUMA nodes, then across physical devices, then the lowest IDs."""
    return _balanced(devices, request, (_numa_of, group_of))


def replica_spread(devices: Sequence[Device], request: PreferredAllocationRequest) -> tuple[str, ...]:
    """Distinct physical devices first, then the lowest IDs."""
    return _balanced(devices, request, (group_of,))


def numa_pack(devices: Sequence[Device], request: PreferredAllocationRequest) -> tuple[str, ...]:
    """The fewest NUMA nodes, then the lowest IDs.

    When one NUMA node (with the must-include devices on it) can hold the whole answer, the
    answer lies on one node: the node whose lowest IDs come first. Otherwise nodes are added
    greedily, the node with the most candidates first.
    """
    must, candidates, by_id, need = _setup(devices, request)
    used = {n for i in must for n in by_id[i].numa_nodes}
    nodes = sorted({n for i in candidates for n in by_id[i].numa_nodes} | used)
    fits = []
    for node in nodes:
        if used <= {node}:
            on_node = [i for i in candidates if set(by_id[i].numa_nodes) <= {node}]
            if len(on_node) >= need:
                fits.append(on_node[:need])
    if fits:
        return (*must, *min(fits, key=lambda ids: [id_key(i) for i in ids]))
    chosen = list(must)
    left = list(candidates)
    while len(chosen) < len(must) + need and left:
        inside = [i for i in left if set(by_id[i].numa_nodes) <= used]
        if not inside:
            per_node: Mapping[int, int] = Counter(
                n for i in left for n in by_id[i].numa_nodes if n not in used
            )
            if per_node:
                used.add(min(per_node, key=lambda n: (-per_node[n], n)))
                continue
            inside = left  # devices without NUMA nodes
        pick = inside[0]
        left.remove(pick)
        chosen.append(pick)
    return tuple(chosen)


POLICIES: Mapping[str, Policy] = {"numa-pack": numa_pack, "spread": spread, "replica-spread": replica_spread}
"""Every policy by its config name."""


def choose(policy: str, devices: Sequence[Device], request: PreferredAllocationRequest) -> tuple[str, ...]:
    """The answer of the policy named ``policy`` (a key of :data:`POLICIES`)."""
    return POLICIES[policy](devices, request)
