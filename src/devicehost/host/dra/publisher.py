"""Keeps one driver's ResourceSlices for this node what the host wants them to be.

The wanted slices change with discovery, health and the resources attached; the published ones
change under us too: the kubelet deletes every slice of its node when it starts, and a driver's
slices when its plugin is gone for a while. So the publisher compares the two on every change
(ours, a deletion seen by its watch, the kubelet registering the driver again) and writes only
the difference. A failing API server is retried with backoff, logged once per problem.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import structlog

from devicehost.host.dra.cluster import Cluster, ClusterError
from devicehost.host.dra.slices import same_devices, slice_body
from devicehost.host.serving.registration import Backoff

STOP_TIMEOUT = 5.0
"""Seconds the final withdrawal of the slices may take when the host stops."""
WATCH_MIN_LIFE = 1.0
"""A watch that ends sooner than this counts as failing (retried with backoff)."""


class Publisher:
    """Publishes the wanted slices of one driver on one node."""

    def __init__(self, cluster: Cluster, node: str, driver: str) -> None:
        self._cluster = cluster
        self._node = node
        self._driver = driver
        self._wanted: dict[str, dict[str, Any]] = {}
        self._generations: dict[str, int] = {}
        """The last pool generation written per slice: one deleted by someone else comes back newer."""
        self._owner: tuple[str, str] | None = None
        self._dirty = asyncio.Event()
        self._synced = asyncio.Event()
        self._backoff = Backoff(0.2, 30.0)
        self.writes = 0
        """Slices created, replaced or deleted so far."""
        self.log = structlog.get_logger(__name__).bind(driver=driver)

    def want(self, name: str, spec: dict[str, Any]) -> None:
        """Publish ``spec`` (its pool generation is set here) as the slice ``name``."""
        if self._wanted.get(name) != spec:
            self._wanted[name] = spec
            self.poke()

    def drop(self, name: str) -> None:
        """Stop publishing the slice ``name`` (it is deleted)."""
        if self._wanted.pop(name, None) is not None:
            self.poke()

    def poke(self) -> None:
        """Compare wanted and published soon (a change, a deletion, a kubelet registration)."""
        self._synced.clear()
        self._dirty.set()

    async def synced(self) -> None:
        """Return once the published slices matched the wanted ones after the last change."""
        await self._synced.wait()

    async def run(self) -> None:
        """Keep the slices in step until cancelled; a watch pokes on every deletion."""
        watch = asyncio.create_task(self._watch_deletions(), name=f"slice watch {self._driver}")
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                try:
                    await self.sync()
                except ClusterError as exc:
                    delay, changed = self._backoff.fail(str(exc))
                    if changed:
                        self.log.error(
                            "publishing ResourceSlices failed, retrying with backoff", error=str(exc)
                        )
                    self._dirty.set()
                    await asyncio.sleep(delay)
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
        self._wanted.clear()
        with contextlib.suppress(ClusterError, TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT):
                await self.sync()
                return
        self.log.warning("ResourceSlices left behind; the kubelet deletes them once the driver is gone")

    async def sync(self) -> None:
        """Create, replace and delete slices until the published ones are the wanted ones."""
        published = await self._cluster.slices(self._node, self._driver)
        if self._wanted and self._owner is None:
            self._owner = (self._node, await self._cluster.node_uid(self._node))
        for name, spec in list(self._wanted.items()):
            await self._write(name, spec, published.get(name))
        for name in published.keys() - self._wanted.keys():
            await self._cluster.delete_slice(name)
            self.writes += 1
            self.log.info("ResourceSlice deleted", slice=name)

    async def _write(self, name: str, spec: dict[str, Any], current: Mapping[str, Any] | None) -> None:
        assert self._owner is not None
        last = self._generations.get(name, 0)
        if current is None:
            body = slice_body(name, self._owner, _with_generation(spec, last + 1))
            await self._cluster.create_slice(body)
            self._generations[name] = last + 1
            self.writes += 1
            self.log.info(
                "ResourceSlice published", slice=name, devices=len(spec["devices"]), generation=last + 1
            )
            return
        if same_devices(dict(current.get("spec", {})), spec):
            return
        generation = max(last, int(current.get("spec", {}).get("pool", {}).get("generation", 0))) + 1
        version = str(current.get("metadata", {}).get("resourceVersion", ""))
        await self._cluster.replace_slice(
            slice_body(name, self._owner, _with_generation(spec, generation), version)
        )
        self._generations[name] = generation
        self.writes += 1
        self.log.info(
            "ResourceSlice updated", slice=name, devices=len(spec["devices"]), generation=generation
        )

    async def _watch_deletions(self) -> None:
        backoff = Backoff(0.5, 30.0)
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                async for name in self._cluster.slice_deletions(self._node, self._driver):
                    if name in self._wanted:
                        self.log.info(
                            "ResourceSlice deleted by someone else, publishing it again", slice=name
                        )
                        self.poke()
                problem = "the watch ended" if loop.time() - started < WATCH_MIN_LIFE else None
            except ClusterError as exc:
                problem = str(exc)
            if problem is None:
                backoff.reset()
            else:  # a watch that fails or ends at once is tried again with backoff, never in a spin
                delay, changed = backoff.fail(problem)
                if changed:
                    self.log.warning("watching ResourceSlices failed, retrying with backoff", error=problem)
                await asyncio.sleep(delay)
            self.poke()  # a watch (re)started may have missed deletions meanwhile


def _with_generation(spec: dict[str, Any], generation: int) -> dict[str, Any]:
    return {**spec, "pool": {**spec["pool"], "generation": generation}}
