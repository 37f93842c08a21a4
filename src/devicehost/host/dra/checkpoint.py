"""The claims a driver has prepared, kept in a file so a restarted host still knows them.

The kubelet asks to prepare a claim once and to unprepare it once, possibly across host
restarts, node reboots and kills in the middle of a call. So each claim is kept with its
:class:`Phase`: recorded ``preparing`` before the backend's allocate hook runs, ``prepared`` once
its CDI spec is on disk, ``unpreparing`` before the release hook runs and ``released`` after it;
a start that finds a claim
``preparing`` or ``unpreparing`` knows a call was cut short and replays from there (see
:mod:`.claims`). A prepared claim keeps its CDI spec (``spec``) and its requests' opaque
configuration (``configs``), so the spec can be written again after a reboot (``/var/run/cdi`` is
a tmpfs) and the backend told what to set up again.

The file is JSON, written to a temporary file beside it, synced and renamed over it, so a crash
leaves the old one or the new one. A file that cannot be read is set aside (renamed to
``<name>.unreadable-<time>``), never a reason not to start.

Two instances of a driver run on one node during a rolling update, and the kubelet may call
either. They share the file: each kubelet call is served holding an exclusive lock on a file
beside it (``flock``, let go by the kernel when a process dies), reading the file again first
when it changed since this instance last saw it, and writing it before letting go
(:meth:`Checkpoint.owned`). So the file has one owner at a time, and either instance prepares or
unprepares any claim as the other left it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from devicehost._files import write_atomically

log = structlog.get_logger(__name__)

CHECKPOINT_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 1 (no phases, no specs) is read as every claim prepared."""
LOCK_POLL = (0.002, 0.05)
"""Seconds between tries for the lock another instance holds: the first, and the most."""
LOCK_SLOW = 5.0
"""Seconds of waiting for the lock after which the wait is said (once)."""

Key = tuple[str, str]
"""(resource, device ID)."""


class Phase(StrEnum):
    """Where a claim is: what a start that finds it does is in :mod:`.claims`."""

    PREPARING = "preparing"
    PREPARED = "prepared"
    UNPREPARING = "unpreparing"
    RELEASED = "released"
    """Being unprepared, its release hooks done: what is left is its spec and its entry."""


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
    """A claim as prepared (or being prepared or unprepared): its name, devices and phase."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    phase: Phase = Phase.PREPARED
    spec: Mapping[str, Any] | None = field(default=None, hash=False)
    """The claim's own CDI spec as written (None: the backend's CDI IDs only, or not yet known)."""
    configs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Each request's opaque parameters for the driver, as read from the claim (None: none)."""

    def by_resource(self) -> dict[str, tuple[str, ...]]:
        """The claim's device IDs, grouped by resource."""
        return by_resource(self.devices)

    def held(self) -> set[Key]:
        """The claim's devices as (resource, device ID)."""
        return {(d.resource, d.device_id) for d in self.devices}


def by_resource(devices: Iterable[PreparedDevice]) -> dict[str, tuple[str, ...]]:
    """Device IDs grouped by resource, in order."""
    grouped: dict[str, list[str]] = {}
    for device in devices:
        grouped.setdefault(device.resource, []).append(device.device_id)
    return {resource: tuple(ids) for resource, ids in grouped.items()}


def claim_from_json(uid: str, entry: Mapping[str, Any]) -> PreparedClaim:
    """One claim of the file (KeyError, TypeError or ValueError when it is not one)."""
    devices = tuple(PreparedDevice(**{**d, "cdi_ids": tuple(d["cdi_ids"])}) for d in entry["devices"])
    spec = entry.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise TypeError(f"claim {uid}: spec is not an object")
    phase = Phase(entry.get("phase", Phase.PREPARED))
    configs = dict(entry.get("configs") or {})
    return PreparedClaim(uid, entry["namespace"], entry["name"], devices, phase, spec, configs)


def entry_json(claim: PreparedClaim) -> str:
    """One claim as the file keeps it: ``"<uid>":{...}``."""
    entry = {
        "namespace": claim.namespace,
        "name": claim.name,
        "phase": str(claim.phase),
        "devices": [asdict(d) for d in claim.devices],
        "spec": claim.spec,
        "configs": dict(claim.configs),
    }
    return f"{json.dumps(claim.uid)}:{json.dumps(entry, sort_keys=True, separators=(',', ':'))}"


class Holders:
    """Which claims hold each device, kept as claims come and go (never counted again per call)."""

    def __init__(self) -> None:
        self._by_key: dict[Key, set[str]] = {}

    def follow(self, uid: str, claim: PreparedClaim, holding: bool) -> None:
        """``claim`` (of UID ``uid``) came (``holding``) or went; a released one holds nothing."""
        if claim.phase is Phase.RELEASED:
            return
        for key in claim.held():
            if holding:
                self._by_key.setdefault(key, set()).add(uid)
            elif key in self._by_key:
                self._by_key[key].discard(uid)
                if not self._by_key[key]:
                    del self._by_key[key]

    def held(self, but: str = "") -> set[Key]:
        """(resource, device ID) of every device a claim holds, the claim ``but`` left out."""
        return {key for key, uids in self._by_key.items() if uids - {but}}

    def holds(self, key: Key, but: str = "") -> bool:
        """Whether a claim other than ``but`` holds the device ``key``."""
        return bool(self._by_key.get(key, set()) - {but})


class Checkpoint:
    """The claims of one driver, by UID, mirrored to ``path``; who holds each device, kept as
    claims come and go (not counted again per call)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        """Held by the instance of the driver that serves a kubelet call right now."""
        self._claims: dict[str, PreparedClaim] = {}
        self._texts: dict[str, str] = {}
        self._holders = Holders()
        self._batching = False
        self._dirty = False
        self._unreadable: str | None = None
        """The reason last said that the file could not be read (each reason said once)."""
        self._reason: str | None = None
        """Why the file could not be read at the last :meth:`load` (None: it could)."""
        self._seen: tuple[int, int, int] | None = None
        """(inode, size, mtime) of the file as last read or written: unchanged, not read again."""
        self.set_aside: list[str] = []
        """Files set aside as unreadable, by this instance (said in ``/status``)."""
        self.moved: tuple[set[Key], set[Key]] = (set(), set())
        """Devices another instance's claims took and let go of, as :meth:`owned` last read them."""

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        return self._claims

    @claims.setter
    def claims(self, claims: Mapping[str, PreparedClaim]) -> None:
        self._claims = dict(claims)
        self._texts = {}
        self._holders = Holders()
        for uid, claim in self._claims.items():
            self._holders.follow(uid, claim, True)

    def load(self) -> str | None:
        """Read the file (none yet: no claims); when it cannot be read, set it aside and say so
        in one line (the claims stay as they were)."""
        try:
            stat = os.stat(self.path)
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            if raw.get("version") not in READABLE_VERSIONS:
                raise ValueError(f"version {raw.get('version')!r} is not {CHECKPOINT_VERSION}")
            self.claims = {uid: claim_from_json(uid, entry) for uid, entry in raw["claims"].items()}
            self._seen = _signature(stat)
        except FileNotFoundError:
            self.claims = {}
            self._seen = None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._reason = f"{self.path}: unreadable ({type(exc).__name__}: {exc})"
            return self._reason + self._set_aside()
        self._reason = None
        return None

    def _set_aside(self) -> str:
        aside, said = set_aside(self.path)
        if aside is not None:
            self.set_aside.append(str(aside))
            self._seen = None
        return said

    def changed_on_disk(self) -> bool:
        """Whether the file is not the one this instance last read or wrote (another wrote it)."""
        try:
            return _signature(os.stat(self.path)) != self._seen
        except FileNotFoundError:
            return self._seen is not None

    def held(self, but: str = "") -> set[Key]:
        """(resource, device ID) of every device a claim holds, the claim ``but`` left out."""
        return self._holders.held(but)

    def holds(self, key: Key, but: str = "") -> bool:
        """Whether a claim other than ``but`` holds the device ``key``."""
        return self._holders.holds(key, but)

    def add(self, claim: PreparedClaim) -> None:
        """Record ``claim`` (replacing its entry); the file is written now, or once at the end
        of a :meth:`batch` (or at :meth:`flush`)."""
        old = self._claims.get(claim.uid)
        if old is not None:
            self._holders.follow(claim.uid, old, False)
        self._claims[claim.uid] = claim
        self._texts[claim.uid] = entry_json(claim)
        self._holders.follow(claim.uid, claim, True)
        self._changed()

    def remove(self, uid: str) -> None:
        """Forget the claim ``uid``; written as :meth:`add` is."""
        old = self._claims.pop(uid, None)
        if old is not None:
            self._texts.pop(uid, None)
            self._holders.follow(uid, old, False)
            self._changed()

    @contextlib.asynccontextmanager
    async def owned(self) -> AsyncIterator[None]:
        """Hold the lock, read the file again if another instance wrote it, and write it once
        when the block ends, as :meth:`batch`. A file that cannot be read is set aside, the
        claims kept as they were (said once)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = await lock(self.lock_path)
        try:
            self.moved = (set(), set())
            if self.changed_on_disk():
                before = self.held()
                problem = self.load()
                after = self.held()
                self.moved = (after - before, before - after)
                # the same reason is said once, whatever name the file was set aside under
                if problem and self._reason != self._unreadable:
                    log.error(
                        "prepared claims checkpoint unreadable, kept as this host had it", problem=problem
                    )
                self._unreadable = self._reason
                if problem:
                    self._dirty = True  # written again from what this host has
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
            self.flush()

    def flush(self) -> bool:
        """Write the file now if anything changed since it was last written; whether it was."""
        if not self._dirty:
            return False
        self._write()
        return True

    def _changed(self) -> None:
        self._dirty = True
        if not self._batching:
            self._write()

    def _write(self) -> None:
        if len(self._texts) != len(self._claims):  # claims set whole (loaded): their texts made once
            self._texts = {uid: entry_json(claim) for uid, claim in self._claims.items()}
        entries = ",".join(self._texts.values())  # each claim's text kept: one join, not one dumps a claim
        self._dirty = True  # until written
        self._seen = write_file(self.path, f'{{"version":{CHECKPOINT_VERSION},"claims":{{{entries}}}}}\n')
        self._dirty = False


def write_file(path: Path, text: str) -> tuple[int, int, int]:
    """Write ``text`` as ``path``, whole (:func:`devicehost._files.write_atomically`); the
    written file's :func:`_signature`."""
    return _signature(write_atomically(path, text))


def set_aside(path: Path) -> tuple[Path | None, str]:
    """Rename an unreadable file out of the way (a directory is left: it needs a person); where
    it went, and the end of the line that says so."""
    if not path.is_file():
        return None, ""
    stamp = f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}"
    aside = path.with_name(stamp)
    for n in itertools.count(2):  # never over one set aside before (in the same second)
        if not aside.exists():
            break
        aside = path.with_name(f"{stamp}-{n}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        return None, f"; not set aside: {exc}"
    return aside, f"; set aside as {aside.name}"


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


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
