"""An "x1" accelerator: cards of four partitions drawing on one counter set, served both ways.

Written as a vendor writes a backend from the docs (see the README): a settings model, a claim
config model with examples, health read from a fault file (a card's fault takes its partitions
down with it), a CDI device per claim and device. ``settings.bug`` plants one mistake a vendor
makes, for ``tests/test_conformance.py`` to see the conformance suite name it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, Health, Resource, cdi

RESOURCE = "x1.example.com/accel"
CLAIM_KIND = "x1.example.com/claim"
PARTITIONS = 4
UID_LENGTH = 36
"""A claim UID's length: the CDI device of a claim's device is ``<uid>-<device ID>``."""
Bug = Literal["ignores-config", "scrubs-card", "big-partition", "silent-health"]


class X1Settings(BaseModel):
    """``cards``: how many; ``fault_file``: device IDs at fault, one a line (none: in memory)."""

    model_config = ConfigDict(extra="forbid")

    cards: int = Field(1, ge=1, le=8)
    fault_file: Path | None = None
    bug: Bug | None = None


class X1Config(BaseModel):
    """What a claim may ask of its devices: the mode they run in and their clock."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"kind": "X1Config", "mode": "graphics", "clockMhz": 1200},
                {"kind": "X1Config", "mode": "compute"},
            ]
        },
    )

    kind: Literal["X1Config"]
    mode: Literal["compute", "graphics"] = "compute"
    clock_mhz: int = Field(1000, alias="clockMhz", ge=300, le=2000)


def card_of(device_id: str) -> str:
    """``x1-0`` for the card and each of its partitions ``x1-0-p<n>``."""
    return "-".join(device_id.split("-")[:2])


class X1Backend:
    """One resource: per card ``x1-<c>`` and its partitions ``x1-<c>-p0..p3``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings = X1Settings.model_validate({})
        self._faults: set[str] = set()
        self._notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self._claimed: dict[str, cdi.Device] = {}  # CDI device name -> its device

    @devicehost.hookimpl
    def devicehost_settings_model(self) -> type[BaseModel]:
        return X1Settings

    @devicehost.hookimpl
    def devicehost_claim_config_model(self) -> type[BaseModel]:
        return X1Config

    @devicehost.hookimpl
    def devicehost_configure(self, settings: X1Settings) -> None:
        with self._lock:
            self._settings = settings

    def _ids(self) -> list[str]:
        cards = [f"x1-{c}" for c in range(self._settings.cards)]
        return [i for card in cards for i in (card, *(f"{card}-p{p}" for p in range(PARTITIONS)))]

    def _faulty(self) -> set[str]:
        if self._settings.bug == "silent-health":
            return set()
        path = self._settings.fault_file
        if path is None:
            return set(self._faults)
        return set(path.read_text().split()) if path.exists() else set()

    def _health(self, device_id: str, faulty: set[str]) -> Health:
        down = device_id in faulty or card_of(device_id) in faulty
        return Health.UNHEALTHY if down else Health.HEALTHY

    def _device(self, device_id: str, faulty: set[str]) -> Device:
        card = card_of(device_id)
        consumes: dict[str, int | str]
        if device_id == card:
            consumes = {"memory": "32Gi", "slices": PARTITIONS}
        else:
            big = self._settings.bug == "big-partition" and device_id.endswith("-p3")
            consumes = {"memory": "40Gi" if big else "8Gi", "slices": 1}
        return Device(device_id, self._health(device_id, faulty), consumes={card: consumes})

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            faulty = self._faulty()
            devices = tuple(self._device(i, faulty) for i in self._ids())
            card: dict[str, int | str] = {"memory": "32Gi", "slices": PARTITIONS}
            sets = {f"x1-{c}": card for c in range(self._settings.cards)}
        return [Resource(RESOURCE, devices, serve_through="both", counter_sets=sets)]

    @devicehost.hookimpl
    def devicehost_health(self, devices: tuple[Device, ...]) -> dict[str, Health]:
        with self._lock:
            faulty = self._faulty()
            return {d.id: self._health(d.id, faulty) for d in devices}

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        with self._lock:
            self._notifiers[resource] = notifier

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        with self._lock:
            self._notifiers.pop(resource, None)

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> ContainerAllocation:
        with self._lock:
            unknown = sorted(set(device_ids) - set(self._ids()))
            if unknown:
                raise ValueError(f"no such x1 devices: {unknown}")
            if claim is None:
                return ContainerAllocation(envs={"X1_DEVICES": ",".join(device_ids)})
            config = (
                claim.config
                if isinstance(claim.config, X1Config)
                else X1Config.model_validate({"kind": "X1Config"})
            )
            if self._settings.bug == "ignores-config":
                config = X1Config.model_validate({"kind": "X1Config"})
            for device in device_ids:
                env = {"X1_DEVICE": device, "X1_MODE": config.mode, "X1_CLOCK_MHZ": str(config.clock_mhz)}
                name = f"{claim.uid}-{device}"
                self._claimed[name] = cdi.Device(name, cdi.ContainerEdits(env=env))
            self._write_spec()
        return ContainerAllocation(cdi_devices=[f"{CLAIM_KIND}={claim.uid}-{d}" for d in device_ids])

    def _write_spec(self) -> None:
        if self._claimed:
            cdi.write_spec(cdi.Spec(kind=CLAIM_KIND, devices=list(self._claimed.values())))
        else:
            cdi.remove_spec(CLAIM_KIND)

    @devicehost.hookimpl
    def devicehost_release(self, device_ids: tuple[str, ...]) -> None:
        """The host releases a device once no claim holds it: its CDI devices go."""
        released = set(device_ids)
        if self._settings.bug == "scrubs-card":  # resets the card: every claim on it loses it
            released = {i for i in self._ids() if card_of(i) in {card_of(d) for d in device_ids}}
        with self._lock:
            for name in [n for n in self._claimed if n[UID_LENGTH + 1 :] in released]:
                del self._claimed[name]
            self._write_spec()

    @devicehost.hookimpl
    def devicehost_conformance_set_health(self, resource: str, device_id: str, health: Health) -> None:
        """The test seam: a fault written to (or cleared from) the fault file."""
        with self._lock:
            path = self._settings.fault_file
            faults = self._faults if path is None else set(path.read_text().split() if path.exists() else ())
            if health == Health.HEALTHY:
                faults.discard(device_id)
            else:
                faults.add(device_id)
            if path is not None:
                path.write_text("".join(f"{f}\n" for f in sorted(faults)))
            faulty = self._faulty()
            changed = {i: self._health(i, faulty) for i in self._ids() if card_of(i) == card_of(device_id)}
            notifier = self._notifiers.get(resource)
        if notifier is not None and self._settings.bug != "silent-health":
            notifier.set_health(changed)
