"""devicehost-nodelife: a backend that journals its devices' state and can kill its own process."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, Resource

RESOURCE = "nodelife.example.org/card"


class NodeLifeBackend:
    """``count`` cards; every allocate, release and restore journaled, a kill inside one on demand."""

    def __init__(self) -> None:
        self._count = 4
        self._journal: Path | None = None
        self._kill_file: Path | None = None
        self._refuse_restore = False
        self._metadata = False

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        count = settings.get("count", 4)
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"settings.count must be an integer >= 0, not {count!r}")
        self._count = count
        self._journal = Path(settings["journal"]) if settings.get("journal") else None
        self._kill_file = Path(settings["kill_file"]) if settings.get("kill_file") else None
        self._refuse_restore = bool(settings.get("refuse_restore", False))
        self._metadata = bool(settings.get("metadata", False))

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        cards = tuple(Device(f"card-{n}") for n in range(self._count))
        return [Resource(RESOURCE, cards, device_metadata=self._metadata)]

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> ContainerAllocation:
        self._record("allocate", device_ids, claim)
        return ContainerAllocation(envs={"CARDS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        self._record("release", device_ids, None)

    @devicehost.hookimpl
    def devicehost_restore(self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest) -> None:
        if self._refuse_restore:
            raise RuntimeError(f"cannot set up {', '.join(device_ids)} again")
        self._record("restore", device_ids, claim)

    def _record(self, hook: str, device_ids: tuple[str, ...], claim: ClaimRequest | None) -> None:
        """Journal the call, then die here when the kill file names this hook (once)."""
        if self._journal is not None:
            line = {"hook": hook, "ids": list(device_ids), "claim": claim.uid if claim else None}
            with self._journal.open("a", encoding="utf-8") as journal:
                journal.write(json.dumps(line) + "\n")
        kill = self._kill_file
        if kill is not None and kill.is_file() and kill.read_text().strip() == hook:
            kill.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
