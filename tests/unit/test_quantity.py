"""``devicehost.quantity``: the API server's quantities as exact numbers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devicehost import quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10G", Decimal(10**10)),
        ("1500M", Decimal(15 * 10**8)),
        ("16Gi", Decimal(16 * 2**30)),
        ("1e3", Decimal(1000)),
        ("1500m", Decimal("1.5")),
        ("0.5Ki", Decimal(512)),
        ("100", Decimal(100)),
        (80, Decimal(80)),
    ],
)
def test_quantities_have_their_exact_value(text: str | int, value: Decimal) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize("bad", ["lots", "10 G", "-1", "1Gb", "", True, -3, 1.5])
def test_anything_else_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        quantity.parse(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["Ki", "Mi", "Gi", "k", "M", "G"]))
def test_a_suffix_multiplies_and_the_pattern_agrees(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    assert quantity.PATTERN.fullmatch(text)
    assert quantity.parse(text) == number * quantity.parse(f"1{suffix}")
