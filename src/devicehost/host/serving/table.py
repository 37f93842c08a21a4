"""The devices one resource advertises, and the change signal its ListAndWatch streams wait on.

Changes bump ``version`` and wake every waiting stream; the wire message is built lazily, once
per version, so a burst of changes costs one build and each stream sends only the latest list.
A health change patches a copy of the last built message instead (building 1024 device messages
in Python takes milliseconds, copying the built one and setting a field a tenth of one).

Devices being released (the backend's release hook is running) are advertised Unhealthy
whatever their health, so the kubelet does not hand them out half-scrubbed; so are the devices
*masked* for the device plugin side by the resource's :class:`~devicehost.host.inventory.Inventory`
(held through DRA, or overdrawing a counter set with what both APIs hold). Their own health is
kept and advertised again once the release or the other API's hold ends. A change of the holds
that changes what either API offers bumps ``version`` too: the ListAndWatch streams and the DRA
publisher both follow it (a change only DRA sees keeps the built message, so streams send nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from devicehost.hookspecs.types import Device, Health
from devicehost.host.inventory import ALLOCATED, DEVICE_PLUGIN, DRA, RELEASE, Inventory, Side, View
from devicehost.host.serving import wire
from devicehost.proto.deviceplugin.v1beta1 import api_pb2


class DeviceTable:
    """Devices by ID with their health; ``version`` increases on every change."""

    def __init__(
        self, devices: Sequence[Device], counter_sets: Mapping[str, Mapping[str, int | str]] | None = None
    ) -> None:
        self._devices: dict[str, Device] = {d.id: d for d in devices}
        self.version = 0
        self._changed = asyncio.Event()
        self._message: api_pb2.ListAndWatchResponse | None = None
        self.counter_sets = {name: dict(counters) for name, counters in (counter_sets or {}).items()}
        """The resource's shared counter sets (DRA): counter set -> counter -> amount."""
        self.inventory = Inventory()
        """Who holds which device through which API (change it through :meth:`hold`)."""
        self._view: View | None = None

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices with their own health (a release in progress does not show here)."""
        return tuple(self._devices.values())

    @property
    def releasing(self) -> frozenset[str]:
        """IDs of devices being released, advertised Unhealthy until the release ends."""
        return self.inventory.of(RELEASE)

    def view(self) -> View:
        """What each API may give out now (kept until the holds, devices or counter sets change)."""
        self._view = self._view or self.inventory.view(self._devices, self.counter_sets)
        return self._view

    def _unhealthy(self) -> frozenset[str]:
        """Advertised Unhealthy whatever their health: being released, or masked."""
        return self.releasing | self.view().masked(DEVICE_PLUGIN)

    def advertised(self) -> tuple[Device, ...]:
        """The devices as the kubelet is told: those being released or masked are Unhealthy."""
        unhealthy = self._unhealthy()
        if not unhealthy:
            return tuple(self._devices.values())
        return tuple(
            replace(d, health=Health.UNHEALTHY) if d.id in unhealthy else d for d in self._devices.values()
        )

    def hold(self, holder: str, side: Side, ids: Iterable[str], holding: bool = True) -> None:
        """``holder`` starts (``holding``) or stops holding ``ids`` through ``side``."""
        inventory = self.inventory
        self._held(lambda: inventory.add(holder, side, ids) if holding else inventory.discard(holder, ids))

    def set_held(self, holder: str, side: Side, ids: Iterable[str]) -> None:
        """``holder`` holds exactly ``ids`` through ``side`` (none: nothing), in one change."""
        self._held(lambda: self.inventory.set(holder, side, ids))

    @contextlib.contextmanager
    def allocating(self, ids: Sequence[str], now: float) -> Iterator[None]:
        """Allocate gives ``ids`` out at ``now``: held while its hooks run and after, unless it fails."""
        self._held(lambda: self.inventory.allocated(ids, now))
        try:
            yield
        except BaseException:
            self.hold(ALLOCATED, DEVICE_PLUGIN, ids, False)
            raise

    def follow_pods(self, held: Iterable[str], now: float, grace: float) -> None:
        """What pod-resources lists: :meth:`Inventory.follow_pods`."""
        self._held(lambda: self.inventory.follow_pods(held, now, grace))

    def _held(self, change: Callable[[], bool]) -> None:
        """Change the holds (``change``: True if it did); a change signal only where what either API
        offers changed (a device plugin resource's own Allocate changes nothing its streams send)."""
        before = self._offer()
        if change():
            self._view = None
            after = self._offer()
            if after != before:
                self._bump(keep_message=after[0] == before[0])

    def _offer(self) -> tuple[frozenset[str], frozenset[str], dict[str, dict[str, str]]]:
        """What both APIs offer: advertised Unhealthy, withdrawn from the slices, counters left."""
        return self._unhealthy(), self.view().masked(DRA), self.view().counter_sets_left()

    def unknown(self, ids: Iterable[str]) -> list[str]:
        """The IDs that are not devices of this resource, in order, without repeats."""
        return list(dict.fromkeys(i for i in ids if i not in self._devices))

    def healthy_count(self) -> int:
        """Devices advertised Healthy."""
        return sum(d.health is Health.HEALTHY for d in self.advertised())

    def replace(self, devices: Sequence[Device]) -> bool:
        """Take a new device list; True if anything changed."""
        new = {d.id: d for d in devices}
        if new == self._devices and list(new) == list(self._devices):
            return False
        self._devices = new
        self._view = None
        self._bump()
        return True

    def set_counter_sets(self, counter_sets: Mapping[str, Mapping[str, int | str]]) -> bool:
        """Take the resource's shared counter sets (published through DRA only); True if they changed."""
        new = {name: dict(counters) for name, counters in counter_sets.items()}
        if new == self.counter_sets:
            return False
        self.counter_sets = new
        self._view = None
        self._bump()
        return True

    def set_health(self, health: Mapping[str, Health]) -> bool:
        """Set the health of known devices (unknown IDs are ignored); True if anything changed."""
        changed = {}
        for device_id, value in health.items():
            device = self._devices.get(device_id)
            if device is not None and device.health is not value:
                self._devices[device_id] = replace(device, health=value)
                changed[device_id] = value
        if not changed:
            return False
        built = self._message
        unhealthy = self._unhealthy()
        self._bump()
        if built is not None:  # health only: the order and every other field stay as built
            patched = api_pb2.ListAndWatchResponse()
            patched.CopyFrom(built)
            position = {device_id: n for n, device_id in enumerate(self._devices)}
            for device_id, value in changed.items():
                if device_id in unhealthy:
                    continue  # advertised Unhealthy until its release or mask ends
                patched.devices[position[device_id]].health = value.value
            self._message = patched
        return True

    def message(self) -> api_pb2.ListAndWatchResponse:
        """The ListAndWatch message for the current version."""
        if self._message is None:
            self._message = wire.device_list(self.advertised())
        return self._message

    def wake_all(self) -> None:
        """Wake every waiting stream without a change (they check whether they must end)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self, seen_version: int) -> None:
        """Return once ``version`` differs from ``seen_version`` or ``wake_all`` was called."""
        if self.version == seen_version:
            await self._changed.wait()

    def _bump(self, keep_message: bool = False) -> None:
        self.version += 1
        self._message = self._message if keep_message else None
        self.wake_all()
