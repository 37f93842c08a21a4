"""The devices one resource advertises, and the change signal its ListAndWatch streams wait on.

Changes bump ``version`` and wake every waiting stream; the wire message is built lazily, once
per version, so a burst of changes costs one build and each stream sends only the latest list.
A health change patches a copy of the last built message instead (building 1024 device messages
in Python takes milliseconds, copying the built one and setting a field a tenth of one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from devicehost.hookspecs.types import Device, Health
from devicehost.host.serving import wire
from devicehost.proto.deviceplugin.v1beta1 import api_pb2


class DeviceTable:
    """Devices by ID with their health; ``version`` increases on every change."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self._devices: dict[str, Device] = {d.id: d for d in devices}
        self.version = 0
        self._changed = asyncio.Event()
        self._message: api_pb2.ListAndWatchResponse | None = None

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(self._devices.values())

    def unknown(self, ids: Iterable[str]) -> list[str]:
        """The IDs that are not devices of this resource, in order, without repeats."""
        return list(dict.fromkeys(i for i in ids if i not in self._devices))

    def healthy_count(self) -> int:
        return sum(d.health is Health.HEALTHY for d in self._devices.values())

    def replace(self, devices: Sequence[Device]) -> bool:
        """Take a new device list; True if anything changed."""
        new = {d.id: d for d in devices}
        if new == self._devices and list(new) == list(self._devices):
            return False
        self._devices = new
        self._bump()
        return True

    def set_health(self, health: Mapping[str, Health]) -> bool:
        """Set the health of known devices (unknown IDs are ignored); True if anything changed."""
        changed = {}
        for device_id, value in health.items():
            device = self._devices.get(device_id)
            if device is not None and device.health is not value:
                self._devices[device_id] = Device(device.id, value, device.numa_nodes)
                changed[device_id] = value
        if not changed:
            return False
        built = self._message
        self._bump()
        if built is not None:  # health only: the order and every other field stay as built
            patched = api_pb2.ListAndWatchResponse()
            patched.CopyFrom(built)
            position = {device_id: n for n, device_id in enumerate(self._devices)}
            for device_id, value in changed.items():
                patched.devices[position[device_id]].health = value.value
            self._message = patched
        return True

    def message(self) -> api_pb2.ListAndWatchResponse:
        """The ListAndWatch message for the current version."""
        if self._message is None:
            self._message = wire.device_list(self._devices.values())
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
