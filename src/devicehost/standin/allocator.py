"""The scheduler's structured-parameters allocator, for the stand-in API server: pure.

:func:`allocate` allocates one ResourceClaim (its ``resource.k8s.io/v1`` ``spec``) from the
published ResourceSlices, the DeviceClasses and what other claims already hold, by the rules of
Kubernetes' allocator: each request's devices match its class's and its own CEL selectors
(:mod:`devicehost.standin.cel`); ``count`` devices or, with ``allocationMode: All``, every one
that matches; of a ``firstAvailable`` list the first subrequest that fits (the result's request is
``request/subrequest``); ``matchAttribute``/``distinctAttribute`` constraints across requests;
a device no other claim holds, except for admin access (which takes nothing) and devices that
allow multiple allocations (a new share, its capacity by the request policies of
:mod:`devicehost.standin.capacity`, all shares within the device's capacity); no shared counter
overdrawn by the devices all claims hold; no device with a NoSchedule or NoExecute taint (in its
slice or from a DeviceTaintRule) that the request does not tolerate. It searches as the scheduler
does, backtracking over devices and subrequests in the order published, and refuses with the
message of the scheduler's event (:class:`Unschedulable`). :func:`allocate_together` allocates
the claims of one pod at once, as the scheduler does: all of them or none.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from celpy import celtypes

from devicehost import quantity
from devicehost.resourceapi import AllocatedDevice, ClaimAllocation, OpaqueConfig
from devicehost.standin.capacity import consumption
from devicehost.standin.catalog import Catalog, Published, catalog
from devicehost.standin.cel import Selector, SelectorError, compile_selector, device_variable

__all__ = [
    "CANNOT_ALLOCATE",
    "Allocation",
    "Unschedulable",
    "allocate",
    "allocate_together",
    "cannot_allocate",
]


def cannot_allocate(nodes: int) -> str:
    """The scheduler's FailedScheduling message when no one of ``nodes`` can satisfy the claims."""
    return f"0/{nodes} nodes are available: {nodes} cannot allocate all claims."


CANNOT_ALLOCATE = cannot_allocate(1)
"""The scheduler's FailedScheduling message when the node's devices cannot satisfy the claims."""
SEARCH_LIMIT = 100_000
"""Devices tried before the search gives up (the real scheduler bounds its search in time)."""
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
"""The taint effects that keep a device from a request that does not tolerate them."""


class Exhausted(Exception):
    """The search tried :data:`SEARCH_LIMIT` devices on a node without an answer."""


class Unschedulable(Exception):
    """The scheduler would not allocate the claim: ``str()`` is its event's message, ``why`` the
    stand-in's own account of which request failed."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.why = why


@dataclass(frozen=True)
class Allocation:
    """A claim's allocation: its results and opaque configs (its classes' first, then its own)."""

    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...]


@dataclass(frozen=True)
class Choice:
    """One way to satisfy a request: an ``exactly`` request, or one subrequest of a list."""

    name: str
    """The result's request: ``request`` or ``request/subrequest``."""
    request: str
    class_name: str
    selectors: tuple[Selector, ...]
    count: int
    all: bool
    admin: bool
    tolerations: tuple[Mapping[str, Any], ...]
    capacity: Mapping[str, str]
    claim: int = 0
    """Which of the claims allocated together it is of."""


@dataclass
class Pick:
    """A device the search took for a choice (undone on backtracking)."""

    choice: Choice
    device: Published
    share: dict[str, tuple[Decimal, str]] | None = None
    """What a share of the device takes of each capacity (amount, as text); None: taken whole."""

    @property
    def amounts(self) -> dict[str, Decimal] | None:
        return None if self.share is None else {name: amount for name, (amount, _) in self.share.items()}


@dataclass
class Usage:
    """What every claim holds: devices taken whole, shares' capacity, counters consumed."""

    whole: set[tuple[str, str, str]] = field(default_factory=set)
    holders: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    shared: dict[tuple[str, str, str], dict[str, Decimal]] = field(default_factory=dict)
    counters: dict[tuple[str, str, str], dict[str, Decimal]] = field(default_factory=dict)

    def add(self, device: Published, share: Mapping[str, Decimal] | None, sign: int = 1) -> None:
        """Note (``sign`` -1: forget) one non-admin allocation of ``device``."""
        key = device.key
        if share is None:
            (self.whole.add if sign > 0 else self.whole.discard)(key)
        else:
            _add(self.shared.setdefault(key, {}), share, sign)
        before = self.holders[key]
        self.holders[key] += sign
        if (before == 0) != (self.holders[key] == 0):  # counters go with a device's first holder
            for counter_set, counters in device.consumes.items():
                _add(self.counters.setdefault((device.driver, device.pool, counter_set), {}), counters, sign)

    def free(self, device: Published) -> bool:
        """Whether a new non-admin allocation may have ``device`` (a share where it allows them)."""
        if device.multiple:
            return device.key not in self.whole
        return self.holders[device.key] == 0

    def counters_fit(
        self, device: Published, sets: Mapping[tuple[str, str, str], Mapping[str, Decimal]]
    ) -> bool:
        """Whether taking ``device`` (with no holder yet) overdraws no counter of its pool."""
        if self.holders[device.key]:
            return True
        for counter_set, counters in device.consumes.items():
            key = (device.driver, device.pool, counter_set)
            held, used = sets.get(key), self.counters.get(key, {})
            if held is None:
                return False
            if any(
                name not in held or used.get(name, 0) + amount > held[name]
                for name, amount in counters.items()
            ):
                return False
        return True

    def capacity_fits(self, device: Published, share: Mapping[str, Decimal]) -> bool:
        used = self.shared.get(device.key, {})
        return all(used.get(name, 0) + amount <= device.capacity[name] for name, amount in share.items())


def _add(used: dict[str, Decimal], amounts: Mapping[str, Decimal], sign: int) -> None:
    for name, amount in amounts.items():
        used[name] = used.get(name, Decimal(0)) + sign * amount


def usage(found: Catalog, claims: Iterable[ClaimAllocation]) -> Usage:
    """What the ``claims`` hold of the published devices (admin access holds nothing)."""
    held = Usage()
    for claim in claims:
        for result in claim.devices:
            device = found.by_key.get((result.driver, result.pool, result.device))
            if device is None or result.admin_access:
                continue
            share = {k: quantity.parse(v) for k, v in result.consumed.items()} if result.share_id else None
            held.add(device, share)
    return held


def _choice(
    name: str, request: str, body: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], claim: int
) -> Choice:
    class_name = str(body.get("deviceClassName", ""))
    if class_name not in classes:
        raise Unschedulable(
            f"request {request}: could not retrieve device class {class_name}: "
            f'deviceclass.resource.k8s.io "{class_name}" not found'
        )
    expressions = [
        *(s["cel"]["expression"] for s in classes[class_name].get("spec", {}).get("selectors") or ()),
        *(s["cel"]["expression"] for s in body.get("selectors") or ()),
    ]
    try:
        selectors = tuple(compile_selector(e) for e in expressions)
    except SelectorError as exc:
        raise Unschedulable(f"request {name}: selector: {exc}") from None
    mode = body.get("allocationMode", "ExactCount")
    return Choice(
        name,
        request,
        class_name,
        selectors,
        int(body.get("count", 1)),
        mode == "All",
        bool(body.get("adminAccess", False)),
        tuple(body.get("tolerations") or ()),
        dict((body.get("capacity") or {}).get("requests") or {}),
        claim,
    )


def choices(
    spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], claim: int = 0
) -> list[list[Choice]]:
    """Each request of the claim's ``spec`` (the ``claim``-th allocated together) as the choices
    that satisfy it, in order of preference."""
    found = []
    for request in (spec.get("devices") or {}).get("requests") or ():
        name = request["name"]
        if "firstAvailable" in request:
            found.append(
                [_choice(f"{name}/{s['name']}", name, s, classes, claim) for s in request["firstAvailable"]]
            )
        else:
            found.append([_choice(name, name, request.get("exactly") or {}, classes, claim)])
    return found


def tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint`` (operator Exists or Equal, effect)."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("key") and toleration["key"] != taint.get("key"):
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


@dataclass
class Constraint:
    """A ``matchAttribute`` (``distinct`` False) or ``distinctAttribute`` constraint and the
    attribute values of the devices taken under it."""

    requests: frozenset[str]
    attribute: str
    distinct: bool
    claim: int = 0
    values: list[tuple[str, Any] | None] = field(default_factory=list)
    """The values of the devices taken under it (never None: :meth:`admits` refuses a device without)."""

    def covers(self, choice: Choice) -> bool:
        if choice.claim != self.claim:
            return False
        return not self.requests or bool({choice.request, choice.name} & self.requests)

    def admits(self, value: tuple[str, Any] | None) -> bool:
        if value is None:
            return False
        if self.distinct:
            return value not in self.values
        return not self.values or self.values[0] == value


def constraints(spec: Mapping[str, Any], claim: int = 0) -> list[Constraint]:
    """The constraints of the claim's ``spec`` (the ``claim``-th allocated together)."""
    found = []
    for body in (spec.get("devices") or {}).get("constraints") or ():
        requests = frozenset(body.get("requests") or ())
        if body.get("matchAttribute"):
            found.append(Constraint(requests, body["matchAttribute"], False, claim))
        elif body.get("distinctAttribute"):
            found.append(Constraint(requests, body["distinctAttribute"], True, claim))
    return found


class Search:
    """The backtracking search for the devices of the claims allocated together."""

    def __init__(
        self, requests: Sequence[Sequence[Choice]], found: Catalog, held: Usage, bound: Sequence[Constraint]
    ) -> None:
        self.requests, self.found, self.held, self.bound = requests, found, held, bound
        self.picks: list[Pick] = []
        self.tries = 0
        self.stuck = 0
        """The furthest request the search reached: the one that failed, when it fails."""
        self._suits: dict[tuple[int, str, tuple[str, str, str]], bool] = {}
        self._variables: dict[tuple[str, str, str], celtypes.MapType] = {}

    def run(self) -> bool:
        return self._request(0)

    def candidates(self, choice: Choice) -> list[Published]:
        """The published devices ``choice`` may have: its selectors, taints and capacity asked."""
        return [d for d in self.found.devices if self._suitable(choice, d)]

    def _suitable(self, choice: Choice, device: Published) -> bool:
        key = (choice.claim, choice.name, device.key)
        if key not in self._suits:
            self._suits[key] = self._judge(choice, device)
        return self._suits[key]

    def _judge(self, choice: Choice, device: Published) -> bool:
        if any(
            t.get("effect") in TAINT_EFFECTS and not tolerated(t, choice.tolerations) for t in device.taints
        ):
            return False
        if choice.capacity:
            if device.multiple:
                if consumption(device.entry.get("capacity") or {}, choice.capacity) is None:
                    return False
            elif any(
                name not in device.capacity or quantity.parse(asked) > device.capacity[name]
                for name, asked in choice.capacity.items()
            ):
                return False
        variable = self._variables.get(device.key)
        if variable is None:
            variable = self._variables[device.key] = device_variable(device.driver, device.entry)
        for index, selector in enumerate(choice.selectors):
            try:
                if not selector.matches(variable):
                    return False
            except SelectorError as exc:
                raise Unschedulable(f"request {choice.name}: selector #{index}: {exc}") from None
        return True

    def _request(self, index: int) -> bool:
        self.stuck = max(self.stuck, index)
        if index == len(self.requests):
            return True
        for choice in self.requests[index]:
            found = self.candidates(choice)
            if choice.all:
                self._complete(choice, found)
                if found and self._take_all(index, choice, found):
                    return True
            elif self._pick(index, choice, found, 0, choice.count):
                return True
        return False

    def _complete(self, choice: Choice, found: Sequence[Published]) -> None:
        """Refuse, as the scheduler does, to take "all" devices of a pool being rewritten."""
        busy = sorted(pool for _, pool in {(d.driver, d.pool) for d in found} & self.found.incomplete)
        if busy:
            raise Unschedulable(
                f"request {choice.name}: asks for all devices, but resource pool {busy[0]} is currently being updated"
            )

    def _pick(self, index: int, choice: Choice, found: Sequence[Published], start: int, left: int) -> bool:
        if left == 0:
            return self._request(index + 1)
        for at in range(start, len(found) - left + 1):
            if self._take(choice, found[at]):
                if self._pick(index, choice, found, at + 1, left - 1):
                    return True
                self._drop()
        return False

    def _take_all(self, index: int, choice: Choice, found: Sequence[Published]) -> bool:
        taken = 0
        for device in found:
            if not self._take(choice, device):
                break
            taken += 1
        if taken == len(found) and self._request(index + 1):
            return True
        for _ in range(taken):
            self._drop()
        return False

    def _take(self, choice: Choice, device: Published) -> bool:
        """Take ``device`` for ``choice`` where every rule allows it."""
        self.tries += 1
        if self.tries > SEARCH_LIMIT:
            raise Exhausted(f"the search gave up after {SEARCH_LIMIT} devices tried")
        covering = [c for c in self.bound if c.covers(choice)]
        values = [device.attribute(c.attribute) for c in covering]
        if not all(c.admits(v) for c, v in zip(covering, values, strict=True)):
            return False
        pick = Pick(choice, device)
        if not choice.admin:
            if not self.held.free(device) or not self.held.counters_fit(device, self.found.counter_sets):
                return False
            if device.multiple:
                pick.share = consumption(device.entry.get("capacity") or {}, choice.capacity)
                if pick.amounts is None or not self.held.capacity_fits(device, pick.amounts):
                    return False
            self.held.add(device, pick.amounts)
        for constraint, value in zip(covering, values, strict=True):
            constraint.values.append(value)
        self.picks.append(pick)
        return True

    def _drop(self) -> None:
        pick = self.picks.pop()
        if not pick.choice.admin:
            self.held.add(pick.device, pick.amounts, -1)
        for constraint in self.bound:
            if constraint.covers(pick.choice):
                constraint.values.pop()


def _configs(
    spec: Mapping[str, Any], picks: Sequence[Pick], classes: Mapping[str, Mapping[str, Any]]
) -> tuple[OpaqueConfig, ...]:
    """The allocation's opaque configs: each class's (for the requests that used it), then the claim's."""
    used: dict[str, list[str]] = {}
    for pick in picks:
        names = used.setdefault(pick.choice.class_name, [])
        if pick.choice.name not in names:
            names.append(pick.choice.name)
    found = [
        OpaqueConfig(c["opaque"]["driver"], c["opaque"].get("parameters") or {}, tuple(names))
        for class_name, names in used.items()
        for c in classes[class_name].get("spec", {}).get("config") or ()
        if c.get("opaque")
    ]
    found += [
        OpaqueConfig(
            c["opaque"]["driver"], c["opaque"].get("parameters") or {}, tuple(c.get("requests") or ())
        )
        for c in (spec.get("devices") or {}).get("config") or ()
        if c.get("opaque")
    ]
    return tuple(found)


def allocate(
    spec: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    claims: Iterable[ClaimAllocation] = (),
    taint_rules: Iterable[Mapping[str, Any]] = (),
    node: str | None = None,
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> Allocation:
    """Allocate a claim (its ``spec``) as the scheduler would on ``node`` (None: every slice).

    :param classes: the DeviceClasses by name (as JSON).
    :param claims: what the other claims hold.
    :param taint_rules: the DeviceTaintRules (as JSON).
    :raises Unschedulable: the scheduler would not allocate it, with its event's message.
    """
    (allocation,) = allocate_together(
        [spec], slices=slices, classes=classes, claims=claims, taint_rules=taint_rules, node=node,
        share_id=share_id,
    )  # fmt: skip
    return allocation


def allocate_together(
    specs: Sequence[Mapping[str, Any]],
    *,
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    claims: Iterable[ClaimAllocation] = (),
    taint_rules: Iterable[Mapping[str, Any]] = (),
    node: str | None = None,
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> list[Allocation]:
    """Allocate the claims of one pod (their ``specs``) together, as the scheduler does: every
    one or none, all on one node (``node``, else the first of the slices' nodes, by name, where
    they fit); their allocations in order. Parameters as for :func:`allocate`."""
    slices, claims, taint_rules = list(slices), list(claims), list(taint_rules)
    requests = [r for index, spec in enumerate(specs) for r in choices(spec, classes, index)]
    nodes = (
        [node] if node is not None else sorted({s["spec"].get("nodeName") for s in slices} - {None}) or [None]
    )
    whys = []
    for name in nodes:
        found = catalog(slices, taint_rules, name)
        bound = [c for index, spec in enumerate(specs) for c in constraints(spec, index)]
        search = Search(requests, found, usage(found, claims), bound)
        try:
            if search.run():
                return _allocations(specs, search.picks, classes, share_id)
            stuck = requests[search.stuck] if search.stuck < len(requests) else []
            why = "; ".join(f"request {c.name}: {len(search.candidates(c))} devices match" for c in stuck)
        except Exhausted as exc:
            why = str(exc)
        why = why or "the claims' constraints cannot all be met"
        whys.append(f"node {name}: {why}" if name is not None and len(nodes) > 1 else why)
    raise Unschedulable(cannot_allocate(len(nodes)), "; ".join(whys))


def _allocations(
    specs: Sequence[Mapping[str, Any]], picks: Sequence[Pick], classes: Mapping[str, Mapping[str, Any]],
    share_id: Callable[[], str],
) -> list[Allocation]:  # fmt: skip
    """Each claim's allocation of the search's ``picks``."""
    allocations = []
    for index, spec in enumerate(specs):
        mine = [p for p in picks if p.choice.claim == index]
        devices = tuple(
            AllocatedDevice(
                p.choice.name,
                p.device.driver,
                p.device.pool,
                p.device.name,
                p.choice.admin,
                share_id() if p.share is not None else "",
                {k: v[1] for k, v in (p.share or {}).items()},
            )
            for p in mine
        )
        allocations.append(Allocation(devices, _configs(spec, mine, classes)))
    return allocations
