"""Keeps one driver's ResourceSlices for this node what the host wants them to be.

The wanted slices change with discovery, health and the resources attached; the published ones
change under us too: the kubelet deletes every slice of its node when it starts, and a driver's
slices when its plugin is gone for a while. So the publisher compares the two on every change
(ours, a deletion seen by its watch, the kubelet registering the driver again) and writes only
the difference. A failing API server is retried with backoff, logged once per problem. Nothing
is compared before the first pool is wanted: a host starting beside another instance of the
driver (a rolling update) would otherwise delete the slices that one publishes, and leave a gap.

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
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog

from devicehost.host.dra.cluster import Cluster, ClusterError
from devicehost.host.dra.slices import slice_body
from devicehost.host.dra.stats import Timings
from devicehost.host.serving.registration import Backoff

STOP_TIMEOUT = 5.0
"""Seconds the final withdrawal of the slices may take when the host stops."""
PACE_SLACK = 0.01
"""Seconds added to a wait for a pool's interval: asyncio wakes a timer up to its clock resolution
early, and a sync that found the pool still held for a few microseconds would list slices again."""
WATCH_MIN_LIFE = 1.0
"""A watch that ends sooner than this counts as failing (retried with backoff)."""
MIN_INTERVAL = 1.0
"""Seconds between two writes of one pool: changes inside are merged into one write at the end."""

WantedSlice = tuple[str, dict[str, Any]]
"""A slice's name and its ``spec`` (the pool's slice count and generation are set here)."""
Write = tuple[str, dict[str, Any], Mapping[str, Any] | None]
"""A slice's name, its whole ``spec``, and the published slice it replaces (None: created)."""


class Publisher:
    """Publishes the wanted pools of one driver on one node."""

    def __init__(self, cluster: Cluster, node: str, driver: str, min_interval: float = MIN_INTERVAL) -> None:
        self._cluster = cluster
        self._node = node
        self._driver = driver
        self._pools: dict[str, list[WantedSlice]] = {}
        """The wanted slices of each pool, first to last, by the key the caller gave."""
        self._generations: dict[str, int] = {}
        """The last generation written per pool name: one deleted by someone else comes back newer."""
        self._owner: tuple[str, str] | None = None
        self._dirty = asyncio.Event()
        self._wanted = asyncio.Event()  # set by the first pool wanted
        self._synced = asyncio.Event()
        self._backoff = Backoff(0.2, 30.0)
        self._pace = Pace(min_interval)
        self.writes = 0
        """Slices created, replaced or deleted so far."""
        self.publish_seconds = Timings()  # each sync that wrote: how long (the publish latency)
        self.log = structlog.get_logger(__name__).bind(driver=driver)

    def want_pool(self, key: str, slices: Sequence[WantedSlice]) -> None:
        """Publish ``slices`` (at least one, all of one pool, first to last) as the pool ``key``.

        A slice name another pool of this publisher has is refused (said, and nothing changes).
        """
        wanted = [(name, spec) for name, spec in slices]
        taken = {name for other, them in self._pools.items() if other != key for name, _ in them}
        clash = sorted(taken.intersection(name for name, _ in wanted))
        if clash:
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

    def want(self, name: str, spec: dict[str, Any]) -> None:
        """Publish ``spec`` as the slice ``name``, a pool of one slice (keyed by ``name``)."""
        self.want_pool(name, [(name, spec)])

    def drop(self, name: str) -> None:
        """Stop publishing the one-slice pool :meth:`want` published as ``name``."""
        self.drop_pool(name)

    def poke(self) -> None:
        """Compare wanted and published soon (a change, a deletion, a kubelet registration)."""
        self._synced.clear()
        self._dirty.set()

    async def synced(self) -> None:
        """Return once the published slices matched the wanted ones after the last change."""
        await self._synced.wait()

    async def run(self) -> None:
        """Keep the slices in step from the first pool wanted until cancelled; a watch pokes on every deletion."""
        await self._wanted.wait()
        watching = watch_deletions(self._cluster, self._node, self._driver, self._pools, self.poke, self.log)
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
        for slices in pools:
            pool = slices[0][1]["pool"]["name"]
            generation = max(self._generations.get(pool, 0), seen.get(pool, 0))
            writes = pool_writes(slices, published, generation)
            if writes and not (coalesce and self._pace.held(pool, waits, started)):
                for name, spec, current in writes:
                    await self._write(name, spec, current)
        return min(waits.values(), default=None)

    async def _write(self, name: str, spec: dict[str, Any], current: Mapping[str, Any] | None) -> None:
        assert self._owner is not None
        pool = spec["pool"]
        self._pace.wrote(pool["name"])  # tried: a refused write is load too
        if current is None:
            await self._cluster.create_slice(slice_body(name, self._owner, spec))
        else:
            version = str(current.get("metadata", {}).get("resourceVersion", ""))
            await self._cluster.replace_slice(slice_body(name, self._owner, spec, version))
        self._generations[pool["name"]] = max(self._generations.get(pool["name"], 0), pool["generation"])
        self.writes += 1
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
        self.writes += 1
        self.log.info("ResourceSlice deleted", slice=name)


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


async def timed(publisher: Publisher, sync: Awaitable[float | None]) -> float | None:
    """Await the publisher's ``sync``; when it wrote, its time goes to the publish latency."""
    started, writes = time.monotonic(), publisher.writes
    held = await sync
    if publisher.writes != writes:
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


async def watch_deletions(
    cluster: Cluster,
    node: str,
    driver: str,
    pools: Mapping[str, Sequence[WantedSlice]],
    poke: Callable[[], None],
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Poke the publisher when a slice of ``driver`` on ``node`` that ``pools`` (the publisher's,
    as they change) want is deleted by anyone, and after every (re)start of the watch, which may
    have missed deletions; for ever."""
    backoff = Backoff(0.5, 30.0)
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            async for name in cluster.slice_deletions(node, driver):
                if any(name == wanted for pool in pools.values() for wanted, _ in pool):
                    log.info("ResourceSlice deleted by someone else, publishing it again", slice=name)
                    poke()
            problem = "the watch ended" if loop.time() - started < WATCH_MIN_LIFE else None
        except ClusterError as exc:
            problem = str(exc)
        if problem is None:
            backoff.reset()
        else:  # a watch that fails or ends at once is tried again with backoff, never in a spin
            delay, changed = backoff.fail(problem_kind(problem))
            if changed:
                log.warning("watching ResourceSlices failed, retrying with backoff", error=problem)
            await asyncio.sleep(delay)
        poke()


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


def problem_kind(problem: str) -> str:
    """What a failure is, without the numbers that change from one try to the next (a
    resourceVersion in "Too large resource version: 682, current: 681"): said once, not per try."""
    return re.sub(r"\d+", "N", problem)


def _in_pool(spec: dict[str, Any], slice_count: int, generation: int) -> dict[str, Any]:
    """``spec`` as one of ``slice_count`` slices of its pool at ``generation``."""
    return {**spec, "pool": {**spec["pool"], "generation": generation, "resourceSliceCount": slice_count}}
