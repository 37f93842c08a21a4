"""Keeps one driver's ResourceSlices for this node what the host wants them to be.

The wanted slices change with discovery, health and the resources attached; the published ones
change under us too: the kubelet deletes every slice of its node when it starts, and a driver's
slices when its plugin is gone for a while, and an operator or a controller may delete or edit
one. So the publisher compares the two on every change (ours, a deletion or an edit of a slice
it wrote seen by its watch, the kubelet registering the driver again) and writes only the
difference: a slice deleted or changed by anything else is written back within ``min_interval``
(:data:`MIN_INTERVAL`) of the change, said once per slice in the log and counted per pool
(:attr:`Written.restored`). During a rolling update the older instance leaves an edit of a
slice to the newer one (``superseded``), so two versions that publish a pool differently do not
rewrite each other's slices for as long as both run. A failing API server is retried with
backoff, logged once per problem.

Nothing is compared before the first pool is wanted and the publisher is opened
(:meth:`Publisher.open`: the kubelet registered the driver): a host starting beside another
instance of the driver (a rolling update) would otherwise delete the slices that one publishes,
and leave a gap, and the scheduler would place claims the kubelet cannot prepare yet (it fails
such a pod with "DRA driver ... is not registered" and did not try it again). Until then the
slices published are left as they are: those of another instance, or of this host before a
restart, are still right.

The host wants pools: a resource's devices are one pool over as many slices as they need. Every
slice of a pool carries the pool's ``resourceSliceCount`` and ``generation``; the scheduler
uses only the slices of a pool's newest generation, and a pool only once it sees
``resourceSliceCount`` slices of it. So a pool is written the way the Go helper
(``k8s.io/dynamic-resource-allocation/resourceslice``) writes it:

- a change that rewrites exactly one existing slice of a pool of several, and creates none,
  keeps the generation: that one write replaces the slice whole, so the scheduler sees the pool
  before it or after it, never a mix (a device flapping costs one write, not one per slice);
- any other change (a slice to create, more than one to change, the slice count changing, a
  pool of one slice changing) moves the generation up and rewrites every slice of the pool:
  first the slices that are no longer wanted are deleted, then the others are replaced and the
  missing created, all with the new generation. Until the last is written the scheduler sees
  the pool incomplete (fewer slices of the new generation than it says), never mixed;
- the generation is never lower than any the pool had (published, or written by this host and
  deleted since), so a slice deleted by someone else comes back newer than what the scheduler saw.

The API server's load is bounded: a pool is written (any slice of it created, replaced or
deleted) at most once every ``min_interval`` seconds (:data:`MIN_INTERVAL`). A change that comes
sooner waits for the interval's end and is written then, with every change after it merged in:
what is wanted at that moment. A device flapping every 100 ms costs its slice one write a second,
and the last state is always written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog

from devicehost.host.dra.cluster import Cluster, ClusterError
from devicehost.host.dra.rewatch import problem_kind, rewatch
from devicehost.host.dra.slices import slice_body
from devicehost.host.dra.stats import Timings
from devicehost.host.serving.registration import Backoff

STOP_TIMEOUT = 5.0
"""Seconds the final withdrawal of the slices may take when the host stops."""
PACE_SLACK = 0.01
"""Seconds added to a wait for a pool's interval: asyncio wakes a timer up to its clock resolution
early, and a sync that found the pool still held for a few microseconds would list slices again."""
MIN_INTERVAL = 1.0
"""Seconds between two writes of one pool: changes inside are merged into one write at the end."""

WantedSlice = tuple[str, dict[str, Any]]
"""A slice's name and its ``spec`` (the pool's slice count and generation are set here)."""
Write = tuple[str, dict[str, Any], Mapping[str, Any] | None]
"""A slice's name, its whole ``spec``, and the published slice it replaces (None: created)."""


class Publisher:
    """Publishes the wanted pools of one driver on one node."""

    def __init__(
        self,
        cluster: Cluster,
        node: str,
        driver: str,
        min_interval: float = MIN_INTERVAL,
        superseded: Callable[[], bool] = lambda: False,
    ) -> None:
        self._cluster = cluster
        self._node = node
        self._driver = driver
        self._pools: dict[str, list[WantedSlice]] = {}
        """The wanted slices of each pool, first to last, by the key the caller gave."""
        self.written = Written(superseded)
        self._owner: tuple[str, str] | None = None
        self._dirty = asyncio.Event()
        self._wanted = asyncio.Event()  # set by the first pool wanted
        self._open = asyncio.Event()  # set once the kubelet registered the driver
        self._synced = asyncio.Event()
        self._backoff = Backoff(0.2, 30.0)
        self._pace = Pace(min_interval)
        self.publish_seconds = Timings()  # each sync that wrote: how long (the publish latency)
        self.log = structlog.get_logger(__name__).bind(driver=driver)

    def want_pool(self, key: str, slices: Sequence[WantedSlice]) -> None:
        """Publish ``slices`` (at least one, all of one pool, first to last) as the pool ``key``; a
        slice name another pool of this publisher has is refused (said, and nothing changes)."""
        wanted = [(name, spec) for name, spec in slices]
        if clash := taken_names(self._pools, key, wanted):
            self.log.error("ResourceSlice names taken by another pool, not published", pool=key, slices=clash)
            return
        if self._pools.get(key) != wanted:
            self._pools[key] = wanted
            self._wanted.set()
            self.poke()

    def drop_pool(self, key: str) -> None:
        """Stop publishing the pool ``key`` (its slices are deleted)."""
        if self._pools.pop(key, None) is not None:
            self.poke()

    def open(self) -> None:
        """Publish from now on (the kubelet registered the driver: it prepares what is placed)."""
        self._open.set()
        self.poke()

    def poke(self) -> None:
        """Compare wanted and published soon (a change, a deletion, a kubelet registration)."""
        self._synced.clear()
        self._dirty.set()

    async def synced(self) -> None:
        """Return once the published slices matched the wanted ones after the last change."""
        await self._synced.wait()

    async def run(self) -> None:
        """Keep the slices in step from the first pool wanted once open, until cancelled; a watch
        pokes on every deletion or edit by someone else."""
        await asyncio.gather(self._wanted.wait(), self._open.wait())
        theirs = functools.partial(self.written.theirs, pools=self._pools)
        watching = watch_slices(self._cluster, self._node, self._driver, theirs, self.poke, self.log)
        watch = asyncio.create_task(watching, name=f"slice watch {self._driver}")
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                try:
                    held = await timed(self, self.sync(coalesce=True))
                except Exception as exc:  # a bug too: said with its traceback, never a silent end
                    self._dirty.set()
                    await asyncio.sleep(failed(exc, self._backoff, self.log))
                    continue
                if held is not None:  # changes merge until the pool may be written again
                    self._dirty.set()
                    await asyncio.sleep(held + PACE_SLACK)
                    continue
                if self._backoff.reset():
                    self.log.info("ResourceSlices published again")
                if not self._dirty.is_set():
                    self._synced.set()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def withdraw_all(self) -> None:
        """Delete every slice this driver published for the node (the host stops, or no resource is left)."""
        self._pools.clear()
        with contextlib.suppress(ClusterError, TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT):
                await self.sync()
                return
        self.log.warning("ResourceSlices left behind; the kubelet deletes them once the driver is gone")

    async def sync(self, coalesce: bool = False) -> float | None:
        """Delete, replace and create slices until the published ones are the wanted ones. With
        ``coalesce``, a pool written less than ``min_interval`` ago is left as it is: the seconds
        until the first such pool may be written (None: nothing was left)."""
        started = time.monotonic()
        published = dict(await self._cluster.slices(self._node, self._driver))
        pools = list(self._pools.values())
        if pools and self._owner is None:
            self._owner = (self._node, await self._cluster.node_uid(self._node))
        seen = newest_generations(published.values())
        wanted = {name: spec["pool"]["name"] for slices in pools for name, spec in slices}
        waits: dict[str, float] = {}  # the pools left as they are: seconds until each may be written
        for name, body in list(published.items()):  # first: devices gone are withdrawn
            pool = str(body.get("spec", {}).get("pool", {}).get("name", ""))
            if wanted.get(name) == pool:
                continue
            if coalesce and self._pace.held(pool, waits, started):
                waits.setdefault(wanted.get(name, pool), waits[pool])  # the pool wanting it waits too
                continue
            await self._delete(name, pool)  # not wanted, or in another pool (a pool name is immutable)
            del published[name]
        for key, slices in list(self._pools.items()):
            pool = slices[0][1]["pool"]["name"]
            generation = max(self.written.generations.get(pool, 0), seen.get(pool, 0))
            writes = pool_writes(slices, published, generation)
            if writes and not (coalesce and self._pace.held(pool, waits, started)):
                for name, spec, current in writes:
                    self.written.restoring(key, name, current, self.log)
                    await self._write(name, spec, current)
        return min(waits.values(), default=None)

    async def _write(self, name: str, spec: dict[str, Any], current: Mapping[str, Any] | None) -> None:
        assert self._owner is not None
        pool = spec["pool"]
        self._pace.wrote(pool["name"])  # tried: a refused write is load too
        if current is None:
            stored = await self._cluster.create_slice(slice_body(name, self._owner, spec))
        else:
            version = str(current.get("metadata", {}).get("resourceVersion", ""))
            stored = await self._cluster.replace_slice(slice_body(name, self._owner, spec, version))
        self.written.wrote(name, spec, stored)
        self.log.info(
            "ResourceSlice published" if current is None else "ResourceSlice updated",
            slice=name,
            devices=len(spec.get("devices", ())),
            generation=pool["generation"],
            slices=pool["resourceSliceCount"],
        )

    async def _delete(self, name: str, pool: str) -> None:
        self._pace.wrote(pool)
        await self._cluster.delete_slice(name)
        self.written.deleted(name)
        self.log.info("ResourceSlice deleted", slice=name)


class Written:
    """What a publisher wrote: each slice's spec (a slice that differs was changed by someone
    else), each pool's newest generation (one deleted by someone else comes back newer), and
    the slices written back after someone else's deletion or edit.

    ``superseded()``: whether a newer instance of the driver serves this node (then an edit by
    someone else is that one's to write back, not ours)."""

    def __init__(self, superseded: Callable[[], bool]) -> None:
        self.specs: dict[str, dict[str, Any]] = {}
        self.generations: dict[str, int] = {}
        self.restored: Counter[str] = Counter()
        """Slices written back after someone else deleted or changed them, by pool key."""
        self.writes = 0
        """Slices created, replaced or deleted so far."""
        self._superseded = superseded

    def wrote(self, name: str, spec: dict[str, Any], stored: Mapping[str, Any]) -> None:
        """``spec`` was written as the slice ``name``; the API server ``stored`` it (what it
        stores is what its watch shows, without the fields it drops)."""
        pool = spec["pool"]
        self.generations[pool["name"]] = max(self.generations.get(pool["name"], 0), pool["generation"])
        self.specs[name] = dict(stored.get("spec") or spec)
        self.writes += 1

    def deleted(self, name: str) -> None:
        self.specs.pop(name, None)
        self.writes += 1

    def theirs(self, kind: str, body: Mapping[str, Any], pools: Mapping[str, Sequence[WantedSlice]]) -> bool:
        """Whether a watch event is someone else's deletion or edit of a slice ``pools`` want
        (an edit not while a newer instance serves)."""
        name = str(body.get("metadata", {}).get("name", ""))
        if not any(name == wanted for pool in pools.values() for wanted, _ in pool):
            return False
        if kind == "DELETED":
            return True
        return body.get("spec") != self.specs.get(name) and not self._superseded()

    def restoring(
        self,
        key: str,
        name: str,
        current: Mapping[str, Any] | None,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        """Count and say a write of ``name`` (of the pool ``key``) that undoes someone else's
        deletion or edit of it (``current``: the slice as published, None: gone)."""
        ours = self.specs.get(name)
        if ours is None or (current is not None and current.get("spec") == ours):
            return
        self.restored[key] += 1
        if current is None:
            log.info("ResourceSlice deleted by someone else, publishing it again", slice=name)
        else:
            log.warning("ResourceSlice changed by someone else, writing it back", slice=name)


class Pace:
    """When each pool was last written (or tried), so that it is written at most once every
    ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._written: dict[str, float] = {}

    def wrote(self, pool: str) -> None:
        self._written[pool] = time.monotonic()

    def held(self, pool: str, waits: dict[str, float], since: float) -> bool:
        """Whether ``pool`` is left as it is by the sync that started at ``since``: in ``waits``
        already, or written less than ``interval`` ago by an earlier sync (then put in ``waits``
        with the seconds until it may be written)."""
        last = self._written.get(pool)
        wait = 0.0 if last is None or last >= since else last + self.interval - time.monotonic()
        if wait > 0:
            waits[pool] = wait
        return pool in waits


def taken_names(
    pools: Mapping[str, Sequence[WantedSlice]], key: str, wanted: Sequence[WantedSlice]
) -> list[str]:
    """The names of ``wanted`` (the pool ``key``) that another of ``pools`` has already, sorted."""
    taken = {name for other, them in pools.items() if other != key for name, _ in them}
    return sorted(taken.intersection(name for name, _ in wanted))


async def timed(publisher: Publisher, sync: Awaitable[float | None]) -> float | None:
    """Await the publisher's ``sync``; when it wrote, its time goes to the publish latency."""
    started, writes = time.monotonic(), publisher.written.writes
    held = await sync
    if publisher.written.writes != writes:
        publisher.publish_seconds.observe(time.monotonic() - started)
    return held


def pool_writes(
    slices: Sequence[WantedSlice], published: Mapping[str, Mapping[str, Any]], generation: int
) -> list[Write]:
    """The writes that make the pool ``slices`` published (``generation``: its newest so far):
    each slice's name, spec and the published slice it replaces (None: created), in order."""
    count = len(slices)
    changed = [
        name
        for name, spec in slices
        if name in published and published[name].get("spec") != _in_pool(spec, count, generation)
    ]
    missing = [name for name, _ in slices if name not in published]
    if not changed and not missing:
        return []
    if missing or len(changed) > 1 or count == 1:
        generation += 1
        changed = [name for name, _ in slices if name in published]
    writes: list[Write] = [
        (name, _in_pool(spec, count, generation), published[name]) for name, spec in slices if name in changed
    ]
    return writes + [
        (name, _in_pool(spec, count, generation), None) for name, spec in slices if name in missing
    ]


async def watch_slices(
    cluster: Cluster,
    node: str,
    driver: str,
    theirs: Callable[[str, Mapping[str, Any]], bool],
    poke: Callable[[], None],
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Poke the publisher on each event of a slice of ``driver`` on ``node`` that ``theirs`` says
    is someone else's change, and after every (re)start of the watch, which may have missed
    some; for ever (:func:`.rewatch.rewatch`)."""

    def seen(event: tuple[str, Mapping[str, Any]]) -> None:
        if theirs(*event):
            poke()

    events = functools.partial(cluster.slice_events, node, driver)
    await rewatch(events, seen, "ResourceSlices", Backoff(0.5, 30.0), log, restarted=poke)


def failed(exc: Exception, backoff: Backoff, log: structlog.typing.FilteringBoundLogger) -> float:
    """Count a failed sync: the seconds to wait, the failure said once per kind of problem (a bug
    with its traceback)."""
    delay, changed = backoff.fail(problem_kind(f"{type(exc).__name__}: {exc}"))
    if changed:
        log.error(
            "publishing ResourceSlices failed, retrying with backoff",
            error=str(exc) if isinstance(exc, ClusterError) else repr(exc),
            exc_info=not isinstance(exc, ClusterError),
        )
    return delay


def newest_generations(published: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The newest generation published per pool name, of slices gone since too."""
    seen: dict[str, int] = {}
    for body in published:
        pool = body.get("spec", {}).get("pool", {})
        name = str(pool.get("name", ""))
        seen[name] = max(seen.get(name, 0), int(pool.get("generation", 0)))
    return seen


def _in_pool(spec: dict[str, Any], slice_count: int, generation: int) -> dict[str, Any]:
    """``spec`` as one of ``slice_count`` slices of its pool at ``generation``."""
    return {**spec, "pool": {**spec["pool"], "generation": generation, "resourceSliceCount": slice_count}}
