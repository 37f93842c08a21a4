"""Kubernetes quantities (``16Gi``, ``100G``, ``1500m``, ``1e3``) as exact numbers: a leaf module.

DRA speaks in quantities: capacities, counters, and what a share of a device took
(:attr:`devicehost.Share.consumed`). ``parse`` turns one into a :class:`~decimal.Decimal`,
exactly, so a backend compares and adds them without float error; the host's rules check amounts
with :data:`PATTERN`.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["PATTERN", "parse"]

PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[mkMGTPE]|[eE][0-9]+)?")
"""A non-negative quantity: a number and one suffix (binary ``Ki``..``Ei``, decimal ``m``,
``k``..``E``, or an exponent ``e3``), as the API server takes them."""

_FACTORS = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def parse(quantity: str | int) -> Decimal:
    """The quantity's value (``parse("10G") == 10**10``, ``parse("1500m") == Decimal("1.5")``).

    :raises ValueError: naming the text, for anything :data:`PATTERN` does not match.
    """
    if isinstance(quantity, int) and not isinstance(quantity, bool) and quantity >= 0:
        return Decimal(quantity)
    found = PATTERN.fullmatch(quantity) if isinstance(quantity, str) else None
    if found is None:
        raise ValueError(f"{quantity!r:.100} is not a quantity such as '16Gi', '100G' or '1500m'")
    number, suffix = Decimal(found[1]), found[2] or ""
    if suffix[:1] in ("e", "E") and suffix not in _FACTORS:
        return number * Decimal(10) ** int(suffix[1:])
    return number * _FACTORS[suffix]
