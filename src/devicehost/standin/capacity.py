"""What a share of a device takes of its consumable capacity, by the capacity's request policy.

A device that allows multiple allocations publishes each capacity with a ``requestPolicy``
(``default``, ``validRange`` of ``min``/``step``/``max``, or ``validValues``); a claim asks for an
amount with ``capacity.requests``. :func:`consumption` gives what the share takes of each of the
device's capacities, as the scheduler computes it: the request raised to the policy's minimum and
rounded up to its step or to the next valid value, the default (else the whole capacity) where
the claim asks nothing; None where the request cannot be met (above ``max``, above every valid
value, or naming a capacity the device lacks).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

from devicehost import quantity

__all__ = ["consumption", "quantity_text"]

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def quantity_text(amount: Decimal, like: str = "") -> str:
    """``amount`` as a quantity: ``like`` itself where it is that amount, else with the largest
    suffix that divides it (binary where ``like`` is binary)."""
    if like and quantity.parse(like) == amount:
        return like
    if amount != amount.to_integral_value():
        return f"{(amount * 1000).to_integral_value(ROUND_CEILING)}m"
    whole = int(amount)
    for suffix, factor in _BINARY if like.endswith("i") else _DECIMAL:
        if whole and whole % factor == 0:
            return f"{whole // factor}{suffix}"
    return str(whole)


def _rounded(asked: Decimal, policy: Mapping[str, Any]) -> Decimal | None:
    """``asked`` as the policy lets it be taken; None where it cannot."""
    if policy.get("validValues"):
        valid = sorted(quantity.parse(v) for v in policy["validValues"])
        return next((v for v in valid if v >= asked), None)
    bounds = policy.get("validRange") or {}
    if "min" not in bounds:
        return asked
    low = quantity.parse(bounds["min"])
    taken = max(asked, low)
    if bounds.get("step"):
        step = quantity.parse(bounds["step"])
        taken = low + ((taken - low) / step).to_integral_value(ROUND_CEILING) * step
    if bounds.get("max") and taken > quantity.parse(bounds["max"]):
        return None
    return taken


def consumption(
    capacities: Mapping[str, Mapping[str, Any]], asked: Mapping[str, str]
) -> dict[str, tuple[Decimal, str]] | None:
    """What one share takes of each capacity (amount, as text) for ``asked`` (capacity.requests),
    by the capacities' request policies; None where the device cannot give it."""
    if set(asked) - set(capacities):
        return None
    taken: dict[str, tuple[Decimal, str]] = {}
    for name, capacity in capacities.items():
        policy = capacity.get("requestPolicy") or {}
        if name in asked:
            amount = _rounded(quantity.parse(asked[name]), policy)
            hint = asked[name]
        elif "default" in policy:
            amount, hint = quantity.parse(policy["default"]), str(policy["default"])
        else:
            amount, hint = quantity.parse(capacity["value"]), str(capacity["value"])
        if amount is None or amount > quantity.parse(capacity["value"]):
            return None
        taken[name] = (amount, quantity_text(amount, hint))
    return taken
