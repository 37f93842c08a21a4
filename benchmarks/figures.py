"""What a measurement reports: figures with an optional baseline, target and verdict."""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, "==": operator.eq}


@dataclass(frozen=True)
class Target:
    """``value <op> limit``, e.g. ``Target("<=", 1.3)``."""

    op: str
    limit: float

    def met(self, value: float) -> bool:
        return bool(_OPS[self.op](value, self.limit))

    def __str__(self) -> str:
        return f"{self.op} {self.limit:g}"


@dataclass(frozen=True)
class Figure:
    """One reported number; ``passed`` is None when it has no target."""

    measurement: str
    name: str
    value: float
    unit: str
    baseline: float | None = None
    target: Target | None = None

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = None if self.target is None else str(self.target)
        data["passed"] = self.passed
        return data


def percentile(samples: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile of ``samples`` (which must not be empty)."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def compared(
    measurement: str,
    name: str,
    host: float,
    bare: float,
    unit: str,
    ratio_target: Target | None = None,
    target: Target | None = None,
) -> list[Figure]:
    """The host's figure beside the bare baseline, and their ratio, each with its own target.

    A bare baseline of 0 (the bare server used no CPU in its idle window, say) has no ratio: the
    host's figure is reported alone, judged by its own target, and the ratio's absence is said.
    """
    figure = Figure(measurement, name, host, unit, baseline=bare, target=target)
    if bare == 0:
        print(f"   {measurement}: {name}: the bare server measured 0, no host/bare ratio", file=sys.stderr)
        return [figure]
    return [figure, Figure(measurement, f"{name} host/bare", round(host / bare, 3), "x", target=ratio_target)]
