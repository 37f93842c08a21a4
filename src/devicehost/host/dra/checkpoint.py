"""The claims a driver has prepared, kept in a file so a restarted host still knows them.

The kubelet asks to prepare a claim once and to unprepare it once, possibly across host
restarts: after one, NodePrepareResources of a prepared claim must answer what it answered
before, and NodeUnprepareResources must find what to release. The file is JSON, written to a
temporary file beside it, synced and renamed over it, so a crash leaves the old one or the new one.

Two instances of a driver run on one node during a rolling update, and the kubelet may call
either. They share the file: each kubelet call is served holding an exclusive lock on a file
beside it (``flock``, let go by the kernel when a process dies), reading the file again first
and writing it before letting go (:meth:`Checkpoint.owned`). So the file has one owner at a
time, and either instance prepares or unprepares any claim as the other left it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

CHECKPOINT_VERSION = 1
LOCK_POLL = (0.002, 0.05)
"""Seconds between tries for the lock another instance holds: the first, and the most."""
LOCK_SLOW = 5.0
"""Seconds of waiting for the lock after which the wait is said (once)."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim: where it is published, what it is, what the runtime got."""

    request: str
    pool: str
    device: str
    resource: str
    device_id: str
    cdi_ids: tuple[str, ...]
    admin_access: bool = False
    share: str = ""
    """The share's ID, for a device that allows multiple allocations ("" when held whole)."""
    consumed: Mapping[str, str] = field(default_factory=dict, hash=False)
    """What the share takes of the device's capacities."""


@dataclass(frozen=True)
class PreparedClaim:
    """A claim as prepared: its name and devices."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def by_resource(self) -> dict[str, tuple[str, ...]]:
        """The claim's device IDs, grouped by resource."""
        return by_resource(self.devices)

    def held(self) -> set[tuple[str, str]]:
        """The claim's devices as (resource, device ID)."""
        return {(d.resource, d.device_id) for d in self.devices}


def by_resource(devices: Iterable[PreparedDevice]) -> dict[str, tuple[str, ...]]:
    """Device IDs grouped by resource, in order."""
    grouped: dict[str, list[str]] = {}
    for device in devices:
        grouped.setdefault(device.resource, []).append(device.device_id)
    return {resource: tuple(ids) for resource, ids in grouped.items()}


class Checkpoint:
    """The prepared claims of one driver, by UID, mirrored to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        """Held by the instance of the driver that serves a kubelet call right now."""
        self.claims: dict[str, PreparedClaim] = {}
        self._batching = False
        self._dirty = False
        self._unreadable: str | None = None

    def load(self) -> str | None:
        """Read the file (none yet: no claims); the problem when it cannot be read, as one line."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            if raw.get("version") != CHECKPOINT_VERSION:
                return f"{self.path}: version {raw.get('version')!r} is not {CHECKPOINT_VERSION}"
            self.claims = {
                uid: PreparedClaim(
                    uid=uid,
                    namespace=entry["namespace"],
                    name=entry["name"],
                    devices=tuple(
                        PreparedDevice(**{**d, "cdi_ids": tuple(d["cdi_ids"])}) for d in entry["devices"]
                    ),
                )
                for uid, entry in raw["claims"].items()
            }
        except FileNotFoundError:
            self.claims = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{self.path}: unreadable ({type(exc).__name__}: {exc})"
        return None

    def held(self, but: str = "") -> set[tuple[str, str]]:
        """(resource, device ID) of every device a prepared claim holds, the claim ``but`` left out."""
        return {key for uid, claim in self.claims.items() if uid != but for key in claim.held()}

    def add(self, claim: PreparedClaim) -> None:
        """Record ``claim``; the file is written now, or once at the end of a :meth:`batch`."""
        self.claims[claim.uid] = claim
        self._changed()

    def remove(self, uid: str) -> None:
        """Forget the claim ``uid``; written as :meth:`add` is."""
        if self.claims.pop(uid, None) is not None:
            self._changed()

    @contextlib.asynccontextmanager
    async def owned(self) -> AsyncIterator[None]:
        """Hold the lock, read the file again, and write it once when the block ends, as
        :meth:`batch`. A file that cannot be read keeps the claims as they were (said once)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = await lock(self.lock_path)
        try:
            problem = self.load()
            if problem and problem != self._unreadable:
                log.error("prepared claims checkpoint unreadable, kept as this host had it", problem=problem)
            self._unreadable = problem
            with self.batch():
                yield
        finally:
            os.close(fd)  # lets go of the lock

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Write the file once when the block ends (also when it raises), not at every change:
        one kubelet call prepares or unprepares many claims, and answers after the block."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            if self._dirty:
                self._write()

    def _changed(self) -> None:
        self._dirty = True
        if not self._batching:
            self._write()

    def _write(self) -> None:
        data = {
            "version": CHECKPOINT_VERSION,
            "claims": {
                uid: {"namespace": c.namespace, "name": c.name, "devices": [asdict(d) for d in c.devices]}
                for uid, c in self.claims.items()
            },
        }
        self._dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(json.dumps(data, indent=1, sort_keys=True))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


async def lock(path: Path) -> int:
    """A descriptor of ``path`` (created if missing) holding an exclusive ``flock`` on it; while
    another process holds it, tried again with backoff (its holder writes within a kubelet call)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    delay, waited = LOCK_POLL[0], 0.0
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if waited < LOCK_SLOW <= waited + delay:
                    log.warning(
                        "waiting for the claims checkpoint: another instance holds it", lock=str(path)
                    )
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, LOCK_POLL[1])
    except BaseException:
        os.close(fd)
        raise
