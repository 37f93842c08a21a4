"""A DRA driver's counts for the operator: prepare and unprepare calls by outcome and duration,
slice writes and publish latency, device health transitions. Plain numbers on the driver, read
through the state snapshot (:class:`~devicehost.host.state.DraCalls`) at scrape time."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from devicehost.host.state import DraCalls, Durations

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
"""Upper bounds in seconds: Prometheus's default buckets, as the reference driver's histograms."""


class Timings:
    """Observed durations, counted into :data:`BUCKETS`."""

    def __init__(self) -> None:
        self._counts = [0] * len(BUCKETS)
        self._total = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self._total += seconds

    def snapshot(self) -> Durations:
        cumulative, buckets = 0, []
        for bound, count in zip(BUCKETS, self._counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return Durations(tuple(buckets), self._total)


class DriverStats:
    """One driver's counts (see the module)."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, str], Timings] = {}
        self._health: dict[tuple[str, str], bool] = {}
        self._transitions: Counter[str] = Counter()

    def claims(self, operation: str, outcomes: Iterable[bool], seconds: float) -> None:
        """One kubelet call (``prepare`` or ``unprepare``) that took ``seconds``, with each claim's
        outcome (True: success)."""
        for ok in outcomes:
            self._claims.setdefault((operation, "success" if ok else "error"), Timings()).observe(seconds)

    def health(self, devices: Iterable[tuple[str, str, bool]]) -> None:
        """The devices' health now, as (pool, device, healthy): a device seen before whose health
        changed counts as a transition to its new health."""
        for pool, device, healthy in devices:
            before = self._health.get((pool, device))
            if before is not None and before != healthy:
                self._transitions["Healthy" if healthy else "Unhealthy"] += 1
            self._health[(pool, device)] = healthy

    def snapshot(self, slice_writes: int, publish: Timings) -> DraCalls:
        """With the publisher's writes and publish timings."""
        claims = {key: timings.snapshot() for key, timings in sorted(self._claims.items())}
        return DraCalls(claims, slice_writes, publish.snapshot(), dict(self._transitions))
