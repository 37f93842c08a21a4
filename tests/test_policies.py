"""devicehost.policies: the invariants every policy keeps, under hypothesis, and what each prefers."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import devicehost
from devicehost import Device, PreferredAllocationRequest
from devicehost.hookspecs import rules
from devicehost.policies import POLICIES, choose, group_of, numa_pack, replica_spread, spread


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[Device], PreferredAllocationRequest]:
    """Devices on 0-3 NUMA nodes, some replicas of one physical device, and a valid request."""
    count = draw(st.integers(1, 12))
    devices = [
        Device(
            f"d{n}",
            numa_nodes=tuple(sorted(draw(st.sets(st.integers(0, 3), max_size=2)))),
            group=draw(st.one_of(st.none(), st.sampled_from(["p0", "p1", "p2"]))),
        )
        for n in range(count)
    ]
    available = draw(st.lists(st.sampled_from([d.id for d in devices]), min_size=1, unique=True))
    must = draw(st.lists(st.sampled_from(available), unique=True))
    size = draw(st.integers(max(len(must), 1), len(available)))
    return devices, PreferredAllocationRequest(tuple(available), tuple(must), size)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@given(case=requests(), seed=st.integers(0, 1000))
def test_every_policy_answers_what_the_kubelet_accepts_and_ignores_the_order(
    policy: str, case: tuple[list[Device], PreferredAllocationRequest], seed: int
) -> None:
    devices, request = case
    answer = choose(policy, devices, request)
    assert (
        rules.preferred_allocation_problem(answer, request.available, request.must_include, request.size)
        is None
    )
    assert answer[: len(request.must_include)] == request.must_include
    shuffled = list(request.available)
    random.Random(seed).shuffle(shuffled)
    again = PreferredAllocationRequest(tuple(shuffled), request.must_include, request.size)
    assert choose(policy, list(reversed(devices)), again) == answer


@given(case=requests())
def test_numa_pack_uses_one_node_whenever_one_node_can_hold_the_answer(
    case: tuple[list[Device], PreferredAllocationRequest],
) -> None:
    devices, request = case
    by_id = {d.id: d for d in devices}
    nodes = {n for d in devices for n in d.numa_nodes}
    fits_one = any(
        all(set(by_id[i].numa_nodes) <= {node} for i in request.must_include)
        and sum(set(by_id[i].numa_nodes) <= {node} for i in request.available) >= request.size
        for node in nodes
    )
    answer = numa_pack(devices, request)
    if fits_one:
        assert len({n for i in answer for n in by_id[i].numa_nodes}) <= 1


@given(case=requests())
def test_replica_spread_takes_distinct_physical_devices_first(
    case: tuple[list[Device], PreferredAllocationRequest],
) -> None:
    devices, request = case
    by_id = {d.id: d for d in devices}
    if request.must_include:
        return
    groups_available = {group_of(by_id[i]) for i in request.available}
    answer = replica_spread(devices, request)
    assert len({group_of(by_id[i]) for i in answer}) == min(request.size, len(groups_available))


@given(case=requests())
def test_spread_covers_as_many_numa_nodes_as_it_can(
    case: tuple[list[Device], PreferredAllocationRequest],
) -> None:
    devices, request = case
    by_id = {d.id: d for d in devices}
    if request.must_include or any(len(d.numa_nodes) != 1 for d in devices):
        return
    nodes_available = {by_id[i].numa_nodes for i in request.available}
    answer = spread(devices, request)
    assert len({by_id[i].numa_nodes for i in answer}) == min(request.size, len(nodes_available))


GPUS = [Device(f"g{n}", numa_nodes=(n // 4,), group=f"gpu{n // 2}") for n in range(8)]
"""Eight replicas: two per physical GPU, four per NUMA node."""


def ask(size: int, must: tuple[str, ...] = ()) -> PreferredAllocationRequest:
    return PreferredAllocationRequest(tuple(d.id for d in GPUS), must, size)


def test_what_each_policy_prefers() -> None:
    assert numa_pack(GPUS, ask(3)) == ("g0", "g1", "g2")
    assert numa_pack(GPUS, ask(2, ("g5",))) == ("g5", "g4")
    assert spread(GPUS, ask(2)) == ("g0", "g4")
    assert replica_spread(GPUS, ask(3)) == ("g0", "g2", "g4")


def test_ids_compare_with_their_numbers() -> None:
    devices = [Device(f"w{n}") for n in (10, 2, 1)]
    assert numa_pack(devices, PreferredAllocationRequest(("w10", "w2", "w1"), (), 2)) == ("w1", "w2")


def test_the_module_is_part_of_the_backend_api() -> None:
    assert "policies" in devicehost.__all__
    assert devicehost.policies.POLICIES is POLICIES
