"""The devices the scheduler allocates from: the newest generation of each published pool.

:func:`catalog` reads ResourceSlices (as JSON) into :class:`Published` devices, in the order the
allocator tries them (by driver, pool and slice name, then as each slice lists them), each with
its taints (its slice's and those of the DeviceTaintRules that select it), and the pools' shared
counter sets. Slices of an older generation of a pool than its newest are left out, as the
scheduler leaves them; a pool with fewer slices of its newest generation than it says it has is
noted as incomplete (being rewritten).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from devicehost import quantity

__all__ = ["Catalog", "Published", "catalog"]


@dataclass(frozen=True)
class Published:
    """One published device, as the allocator sees it."""

    driver: str
    pool: str
    name: str
    entry: Mapping[str, Any] = field(hash=False, compare=False)
    """The slice's entry of the device (as JSON)."""
    taints: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    @property
    def multiple(self) -> bool:
        """Whether it allows multiple allocations (each a share of its capacity)."""
        return bool(self.entry.get("allowMultipleAllocations"))

    @functools.cached_property
    def capacity(self) -> dict[str, Decimal]:
        return {name: quantity.parse(c["value"]) for name, c in (self.entry.get("capacity") or {}).items()}

    @functools.cached_property
    def consumes(self) -> dict[str, dict[str, Decimal]]:
        """What it consumes of each counter set of its pool while allocated."""
        return {
            c["counterSet"]: {
                name: quantity.parse(v["value"]) for name, v in (c.get("counters") or {}).items()
            }
            for c in self.entry.get("consumesCounters") or ()
        }

    def attribute(self, name: str) -> tuple[str, Any] | None:
        """The value of the fully qualified attribute ``name`` (``domain/name``; an unqualified
        name of the device is in its driver's domain) as (type, value); None where it has none."""
        domain, _, short = name.rpartition("/")
        attributes = self.entry.get("attributes") or {}
        found = attributes.get(name) or (attributes.get(short) if domain == self.driver else None)
        return next(iter(found.items())) if found else None


@dataclass
class Catalog:
    """The devices the allocator tries, in order, and the pools' counter sets."""

    devices: list[Published]
    counter_sets: dict[tuple[str, str, str], dict[str, Decimal]]
    """(driver, pool, counter set) to each counter's amount."""
    incomplete: set[tuple[str, str]] = field(default_factory=set)
    """(driver, pool) of the pools with fewer slices of their newest generation than their
    ``resourceSliceCount``: being rewritten."""

    @functools.cached_property
    def by_key(self) -> dict[tuple[str, str, str], Published]:
        return {d.key: d for d in self.devices}


def _ruled(
    driver: str, pool: str, device: str, rules: Iterable[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The taints of the DeviceTaintRules whose selector names this device (every field it sets)."""
    found = []
    for rule in rules:
        selector = rule.get("spec", {}).get("deviceSelector") or {}
        wanted = {"driver": driver, "pool": pool, "device": device}
        if all(selector.get(k) in (None, v) for k, v in wanted.items()):
            found.append(rule["spec"]["taint"])
    return found


def _newest(slices: Iterable[Mapping[str, Any]], node: str | None) -> list[Mapping[str, Any]]:
    """The node's slices (all with None) of each pool's newest generation, in the allocator's order."""
    mine = [s for s in slices if node is None or s["spec"].get("nodeName") in (node, None)]
    newest: dict[tuple[str, str], int] = {}
    for body in mine:
        pool = (body["spec"]["driver"], body["spec"]["pool"]["name"])
        newest[pool] = max(newest.get(pool, 0), int(body["spec"]["pool"].get("generation", 0)))
    return sorted(
        (
            s
            for s in mine
            if int(s["spec"]["pool"].get("generation", 0))
            == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
        ),
        key=lambda s: (s["spec"]["driver"], s["spec"]["pool"]["name"], s["metadata"]["name"]),
    )


def catalog(
    slices: Iterable[Mapping[str, Any]],
    taint_rules: Iterable[Mapping[str, Any]] = (),
    node: str | None = None,
) -> Catalog:
    """The published devices of ``slices`` (of ``node``; every node's with None) and their counters."""
    rules = list(taint_rules)
    devices: list[Published] = []
    counter_sets: dict[tuple[str, str, str], dict[str, Decimal]] = {}
    newest = _newest(slices, node)
    seen = Counter((s["spec"]["driver"], s["spec"]["pool"]["name"]) for s in newest)
    incomplete = {
        (s["spec"]["driver"], s["spec"]["pool"]["name"])
        for s in newest
        if seen[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
        < int(s["spec"]["pool"].get("resourceSliceCount", 1))
    }
    for body in newest:
        spec = body["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        for counter_set in spec.get("sharedCounters") or ():
            counter_sets[(driver, pool, counter_set["name"])] = {
                name: quantity.parse(c["value"]) for name, c in (counter_set.get("counters") or {}).items()
            }
        for entry in spec.get("devices") or ():
            taints = (*(entry.get("taints") or ()), *_ruled(driver, pool, entry["name"], rules))
            devices.append(Published(driver, pool, entry["name"], entry, taints))
    return Catalog(devices, counter_sets, incomplete)
