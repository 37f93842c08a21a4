"""One resource's inventory across both APIs: who holds each device, and what each API may still give out.

A resource served ``both`` offers its devices through the device plugin API and through DRA. A
device given out through one of them (a *hold*) must be unavailable on the other for as long as
it is held, and so must every device whose shared counters the holds would overdraw: a card and
its partitions draw on one counter set, so a held card leaves no partition to give out, and a
held partition leaves no room for the card. :class:`Inventory` keeps the holders of one
resource's devices, each on one side (``device-plugin`` or ``dra``); :class:`View` says, for the
devices and counter sets of one moment, which devices a side must not give out (*masked*), why a
new holder would be refused, and what is left of each counter set for the scheduler.

The two sides are told differently, as each API allows:

- the kubelet does no counter math: a device is masked for the device plugin side when the other
  side holds it, or when it would overdraw a counter set together with everything held through
  either API;
- the scheduler does the counter math of its own claims: a device is masked for DRA when the device
  plugin side holds it, or when it would overdraw a counter set together with what the device
  plugin side holds; and the counter sets published for DRA are what is left after the device
  plugin side's holds, so no set of devices the scheduler picks overdraws them.

A device held by several holders counts once (DRA claims share a device with
``allowMultipleAllocations``, or hold it with admin access). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Literal

from devicehost import quantity
from devicehost.hookspecs.types import Device

Side = Literal["device-plugin", "dra"]
DEVICE_PLUGIN: Side = "device-plugin"
DRA: Side = "dra"
SIDE_NAMES: dict[Side, str] = {DEVICE_PLUGIN: "the device plugin API", DRA: "DRA"}

PODS = "pods"
"""The holder of what the kubelet's pod-resources API lists (the device plugin side)."""
ALLOCATED = "allocated"
"""The holder of what Allocate gave out that pod-resources does not list yet."""
RELEASE = "release"
"""The holder of the devices whose device plugin release hook runs."""

Amounts = dict[tuple[str, str], Decimal]
"""(counter set, counter) -> amount."""


def amounts(counter_sets: Mapping[str, Mapping[str, int | str]]) -> Amounts:
    """Counter sets as exact amounts by (counter set, counter)."""
    return {
        (name, counter): quantity.parse(value)
        for name, counters in counter_sets.items()
        for counter, value in counters.items()
    }


def consumed(devices: Iterable[Device]) -> Amounts:
    """What ``devices`` take together from their resource's counter sets."""
    total: Amounts = {}
    for device in devices:
        for key, value in amounts(device.consumes).items():
            total[key] = total.get(key, Decimal(0)) + value
    return total


def overdrawn(counters: Amounts, used: Amounts) -> tuple[str, str] | None:
    """The first (counter set, counter) that ``used`` takes more of than ``counters`` has."""
    return next((key for key in sorted(used) if used[key] > counters.get(key, Decimal(0))), None)


BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def plain(amount: Decimal) -> str:
    """An amount as a quantity the API server takes, as a person reads it (``24Gi``, ``75``, ``0.5``)."""
    if amount != amount.to_integral_value():
        return format(amount.normalize(), "f")
    whole = int(amount)
    suffix = next(((s, f) for s, f in BINARY_SUFFIXES if whole >= f and whole % f == 0), None)
    return f"{whole // suffix[1]}{suffix[0]}" if suffix else str(whole)


class Inventory:
    """The holders of one resource's devices: holder name -> its side and device IDs.

    A holder is whatever gives devices out as one: ``pods`` (the device plugin side's holds as the
    kubelet's pod-resources API lists them), ``allocated`` (Allocate answered, not listed yet),
    ``release`` (a device plugin release hook running), ``claims`` (devices of prepared DRA
    claims), ``claim <uid>`` (a claim being prepared), ``allocation <namespace>/<name>`` (a claim
    the scheduler allocated, while a resource is served ``both``).
    """

    def __init__(self) -> None:
        self._holders: dict[str, tuple[Side, frozenset[str]]] = {}
        self.pods_followed = False
        """Whether the kubelet's pod-resources API is followed (``device_release``): only then does
        what Allocate gave out stay held, until the kubelet lists it or lets it go."""
        self._allocated_at: dict[str, float] = {}

    def set(self, holder: str, side: Side, ids: Iterable[str]) -> bool:
        """``holder`` holds exactly ``ids`` through ``side`` (none: it is gone); True if that changed."""
        new = frozenset(ids)
        old = self._holders.get(holder)
        if not new:
            return self._holders.pop(holder, None) is not None
        if old == (side, new):
            return False
        self._holders[holder] = (side, new)
        return True

    def add(self, holder: str, side: Side, ids: Iterable[str]) -> bool:
        """``holder`` holds ``ids`` too; True if that changed anything."""
        return self.set(holder, side, self.of(holder) | frozenset(ids))

    def discard(self, holder: str, ids: Iterable[str]) -> bool:
        """``holder`` no longer holds ``ids``; True if that changed anything."""
        found = self._holders.get(holder)
        return found is not None and self.set(holder, found[0], found[1] - frozenset(ids))

    def allocated(self, ids: Iterable[str], now: float) -> bool:
        """Allocate gave ``ids`` out at ``now`` (monotonic seconds): ``allocated`` holds them
        where pod-resources is followed; True if that changed anything."""
        if not self.pods_followed:
            return False
        ids = tuple(ids)
        self._allocated_at.update(dict.fromkeys(ids, now))
        return self.add(ALLOCATED, DEVICE_PLUGIN, ids)

    def follow_pods(self, held: Iterable[str], now: float, grace: float) -> bool:
        """The device plugin side holds ``held``, as pod-resources lists it: ``pods`` holds them;
        what Allocate gave out and it lists, or has not listed within ``grace`` seconds (a pod
        refused after its Allocate never shows there), ``allocated`` no longer does. True if
        that changed anything."""
        held = frozenset(held)
        done = {i for i, at in self._allocated_at.items() if i in held or at < now - grace}
        for device_id in done:
            del self._allocated_at[device_id]
        return self.set(PODS, DEVICE_PLUGIN, held) | self.discard(ALLOCATED, done)

    def of(self, holder: str) -> frozenset[str]:
        """The device IDs ``holder`` holds."""
        return self._holders.get(holder, (DRA, frozenset()))[1]

    def held(self, side: Side | None = None) -> frozenset[str]:
        """The device IDs held through ``side`` (None: either)."""
        found = [ids for s, ids in self._holders.values() if side is None or s == side]
        return frozenset().union(*found)

    def holders(self) -> dict[str, tuple[Side, frozenset[str]]]:
        """Every holder with its side and device IDs."""
        return dict(self._holders)

    def view(
        self, devices: Mapping[str, Device], counter_sets: Mapping[str, Mapping[str, int | str]]
    ) -> View:
        """What each side may give out of ``devices`` now."""
        return View(devices, counter_sets, self.held(DEVICE_PLUGIN), self.held(DRA))


class View:
    """One moment of a resource's inventory: the devices, counter sets and holds of both sides."""

    def __init__(
        self,
        devices: Mapping[str, Device],
        counter_sets: Mapping[str, Mapping[str, int | str]],
        device_plugin: frozenset[str],
        dra: frozenset[str],
    ) -> None:
        self._devices = devices
        self._declared = counter_sets
        self._counters = amounts(counter_sets)
        self._held: dict[Side, frozenset[str]] = {DEVICE_PLUGIN: device_plugin, DRA: dra}
        self._masked: dict[Side, frozenset[str]] = {}
        self._misfits = frozenset(
            i
            for i, d in (devices.items() if self._counters else ())
            if d.consumes and overdrawn(self._counters, amounts(d.consumes))
        )
        """Devices that overdraw a counter set alone: the backend's mistake (conformance's
        ``dra-counters`` names it), which the counter math leaves out."""

    def masked(self, side: Side) -> frozenset[str]:
        """The devices ``side`` must not give out, which it does not hold itself: held through the
        other side, or overdrawing a counter set together with what is held (everything, for the
        kubelet; for DRA what the device plugin side holds: the scheduler counts its own claims)."""
        if side not in self._masked:
            other = self._held[_other(side)]
            counted = other if side == DRA else other | self._held[side]
            if not self._counters or not counted:  # nothing to count: the same device only
                self._masked[side] = frozenset(i for i in other - self._held[side] if i in self._devices)
            else:
                used = self._consumed(counted)
                self._masked[side] = frozenset(
                    i
                    for i, device in self._devices.items()
                    if i not in self._held[side]
                    and (i in other or (device.consumes and self._over(used, counted, device) is not None))
                )
        return self._masked[side]

    def refusal(self, side: Side, ids: Collection[str]) -> str | None:
        """Why ``ids`` cannot go to a new holder through ``side`` (None: they can): one held
        through the other side, or a counter set they would overdraw with everything held."""
        other = self._held[_other(side)]
        taken = sorted(i for i in ids if i in other)
        if taken:
            return f"{taken[0]!r} is held through {SIDE_NAMES[_other(side)]}"
        holding = self._held[DEVICE_PLUGIN] | self._held[DRA] | frozenset(ids)
        key = overdrawn(self._counters, self._consumed(holding))
        if key is None:
            return None
        need = self._consumed(holding)[key]
        return (
            f"{', '.join(repr(i) for i in sorted(ids))} would overdraw counter {key[1]!r} of counter set "
            f"{key[0]!r} with what both APIs hold ({plain(need)} of {plain(self._counters.get(key, Decimal(0)))})"
        )

    def counter_sets_left(self) -> dict[str, dict[str, str]]:
        """The counter sets as DRA publishes them: what the device plugin side's holds leave (the
        scheduler counts its own claims); a counter they take nothing of, as declared."""
        taken = self._consumed(self._held[DEVICE_PLUGIN] - self._held[DRA])
        left: dict[str, dict[str, str]] = {}
        for (name, counter), amount in self._counters.items():
            used = taken.get((name, counter), Decimal(0))
            declared = str(self._declared[name][counter])
            left.setdefault(name, {})[counter] = plain(max(Decimal(0), amount - used)) if used else declared
        return left

    def _consumed(self, ids: Iterable[str]) -> Amounts:
        return consumed(self._devices[i] for i in ids if i in self._devices and i not in self._misfits)

    def _over(self, used: Amounts, counted: frozenset[str], device: Device) -> tuple[str, str] | None:
        """The counter ``device`` would overdraw on top of ``used`` (``counted``'s consumption)."""
        if device.id in counted or device.id in self._misfits:
            return None
        more = amounts(device.consumes)
        return overdrawn(
            self._counters, {k: used.get(k, Decimal(0)) + more.get(k, Decimal(0)) for k in {*used, *more}}
        )


def _other(side: Side) -> Side:
    return DRA if side == DEVICE_PLUGIN else DEVICE_PLUGIN
