"""The devices one resource advertises, and the change signal its ListAndWatch streams wait on.

Changes bump ``version`` and wake every waiting stream; the wire message is built lazily, once
per version, so a burst of changes costs one build and each stream sends only the latest list.
A health change patches a copy of the last built message instead (building 1024 device messages
in Python takes milliseconds, copying the built one and setting a field a tenth of one).

Devices being released (the backend's release hook is running) are advertised Unhealthy
whatever their health, so the kubelet does not hand them out half-scrubbed; their own health
is kept and advertised again once the release ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from devicehost.hookspecs.types import Device, Health
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
        self._holds: dict[str, frozenset[str]] = {}
        """Device IDs advertised Unhealthy whatever their health, by why (release, dra)."""

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices with their own health (a release in progress does not show here)."""
        return tuple(self._devices.values())

    @property
    def releasing(self) -> frozenset[str]:
        """IDs of devices being released, advertised Unhealthy until the release ends."""
        return self._holds.get("release", frozenset())

    def _held(self) -> frozenset[str]:
        return frozenset().union(*self._holds.values())

    def advertised(self) -> tuple[Device, ...]:
        """The devices as the kubelet is told: those held (being released, prepared through
        DRA) are Unhealthy."""
        held = self._held()
        if not held:
            return tuple(self._devices.values())
        return tuple(
            replace(d, health=Health.UNHEALTHY) if d.id in held else d for d in self._devices.values()
        )

    def hold(self, ids: Iterable[str], reason: str, holding: bool) -> None:
        """Start (``holding``) or end advertising ``ids`` Unhealthy for ``reason``."""
        ids = frozenset(ids)
        current = self._holds.get(reason, frozenset())
        changed = current | ids if holding else current - ids
        if changed != current:
            self._holds[reason] = changed
            self._bump()

    def hold_for_release(self, ids: Iterable[str], holding: bool) -> None:
        """Start (``holding``) or end advertising ``ids`` Unhealthy while they are released."""
        self.hold(ids, "release", holding)

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
        self._bump()
        return True

    def set_counter_sets(self, counter_sets: Mapping[str, Mapping[str, int | str]]) -> bool:
        """Take the resource's shared counter sets (published through DRA only); True if they changed."""
        new = {name: dict(counters) for name, counters in counter_sets.items()}
        if new == self.counter_sets:
            return False
        self.counter_sets = new
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
        self._bump()
        if built is not None:  # health only: the order and every other field stay as built
            held = self._held()
            patched = api_pb2.ListAndWatchResponse()
            patched.CopyFrom(built)
            position = {device_id: n for n, device_id in enumerate(self._devices)}
            for device_id, value in changed.items():
                if device_id in held:
                    continue  # advertised Unhealthy until its hold ends
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

    def _bump(self) -> None:
        self.version += 1
        self._message = None
        self.wake_all()
