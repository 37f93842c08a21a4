"""Preferred allocation: which device IDs to hand one container, given the GPUs' topology.

GPUs are chosen first, then IDs on them:

1. The container gets ``min(size, free GPUs)`` distinct GPUs (more if ``must_include`` spans
   more): with time-slicing, replicas of one GPU share its compute, so spreading wins.
2. Among the GPU sets that hold every ``must_include`` GPU, the best spans the fewest NUMA
   nodes, then has the most NVLink-connected pairs, then the most free replicas (least
   loaded), then the lowest indices. Small cases are searched exhaustively, large ones greedily.
3. IDs on the chosen GPUs: ``devicehost.policies.replica_spread`` (``must_include`` first, then
   the GPUs with the fewest IDs chosen so far; all GPUs are chosen whenever ``size`` exceeds
   their number).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

from devicehost import Device, PreferredAllocationRequest, policies
from devicehost_nvidia.inventory import Gpu

EXHAUSTIVE_LIMIT = 5000


def _score(
    gpus: Sequence[Gpu], nvlinked: Callable[[str, str], bool], free: Mapping[str, int]
) -> tuple[int, ...]:
    """Smaller is better."""
    numa_nodes = len({gpu.numa_node for gpu in gpus})
    links = sum(1 for a, b in itertools.combinations(gpus, 2) if nvlinked(a.uuid, b.uuid))
    return (numa_nodes, -links, -sum(free[gpu.uuid] for gpu in gpus), *sorted(g.info.index for g in gpus))


def _choose_gpus(
    candidates: list[Gpu],
    required: list[Gpu],
    count: int,
    nvlinked: Callable[[str, str], bool],
    free: Mapping[str, int],
) -> list[Gpu]:
    """The best ``count`` GPUs including ``required``."""
    others = [gpu for gpu in candidates if gpu not in required]
    need = max(count - len(required), 0)
    if math.comb(len(others), need) <= EXHAUSTIVE_LIMIT:
        best = min(
            itertools.combinations(others, need), key=lambda c: _score([*required, *c], nvlinked, free)
        )
        return [*required, *best]
    chosen = list(required)
    for _ in range(need):
        pick = min(
            (gpu for gpu in others if gpu not in chosen), key=lambda g: _score([*chosen, g], nvlinked, free)
        )
        chosen.append(pick)
    return chosen


def preferred(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    gpu_of: Mapping[str, Gpu],
    nvlinked: Callable[[str, str], bool],
) -> list[str]:
    """``size`` distinct IDs from ``available`` holding every ``must_include``; see the module doc."""
    by_gpu: dict[str, list[str]] = {}
    gpus: dict[str, Gpu] = {}
    for device_id in dict.fromkeys(available):
        gpu = gpu_of[device_id]
        by_gpu.setdefault(gpu.uuid, []).append(device_id)
        gpus[gpu.uuid] = gpu
    free = {uuid: len(ids) for uuid, ids in by_gpu.items()}
    required = list({gpu_of[i].uuid: gpu_of[i] for i in must_include}.values())
    count = max(min(size, len(gpus)), len(required))
    chosen = _choose_gpus(list(gpus.values()), required, count, nvlinked, free)
    on_chosen = [i for gpu in chosen for i in by_gpu[gpu.uuid]]
    devices = [Device(i, group=gpu_of[i].uuid) for i in on_chosen]
    request = PreferredAllocationRequest(tuple(on_chosen), tuple(dict.fromkeys(must_include)), size)
    return list(policies.replica_spread(devices, request))
