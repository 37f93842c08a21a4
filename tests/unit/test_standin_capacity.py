"""What a share takes of a consumable capacity, by its request policy (the scheduler's rounding)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from devicehost.quantity import parse
from devicehost.standin.capacity import consumption, quantity_text


@given(low=st.integers(1, 64), step=st.integers(1, 16), steps=st.integers(0, 64), asked=st.integers(1, 2000))
def test_a_request_is_raised_to_the_minimum_and_rounded_up_to_the_step_within_the_maximum(
    low: int, step: int, steps: int, asked: int
) -> None:
    high = low + steps * step
    policy = {"validRange": {"min": f"{low}Mi", "step": f"{step}Mi", "max": f"{high}Mi"}}
    taken = consumption({"memory": {"value": "4Gi", "requestPolicy": policy}}, {"memory": f"{asked}Mi"})
    fits = [v for v in range(low, high + 1, step) if v >= asked and v <= 4096]
    if not fits:
        assert taken is None
        return
    assert taken is not None
    amount, text = taken["memory"]
    assert amount == fits[0] * 2**20  # the least valid amount that holds the request
    assert parse(text) == amount


@given(values=st.lists(st.integers(1, 100), min_size=1, max_size=6, unique=True), asked=st.integers(1, 120))
def test_a_request_is_rounded_up_to_the_next_valid_value(values: list[int], asked: int) -> None:
    policy = {"validValues": [str(v) for v in values]}
    taken = consumption({"vfs": {"value": "100", "requestPolicy": policy}}, {"vfs": str(asked)})
    bigger = sorted(v for v in values if v >= asked)
    assert (taken["vfs"][0] if taken else None) == (Decimal(bigger[0]) if bigger else None)


def test_defaults_the_whole_and_the_texts() -> None:
    capacities = {
        "memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}},
        "compute": {"value": "100"},
    }
    assert consumption(capacities, {}) == {
        "memory": (Decimal(2**30), "1Gi"),
        "compute": (Decimal(100), "100"),
    }
    assert consumption(capacities, {"compute": "101"}) is None  # beyond the capacity
    assert [
        quantity_text(Decimal(v), like) for v, like in [(2 * 2**30, "1500Mi"), (5 * 10**9, "4G"), (1.5, "1")]
    ] == [
        "2Gi",
        "5G",
        "1500m",
    ]
