"""What a scheduler could do with a driver's slices, watched from the stand-ins.

A claim can be placed on a driver's devices while its ResourceSlices publish some; the kubelet
can prepare it only while it has an instance of the driver registered. :class:`Timeline` notes
both at each change of the API server stand-in, :class:`Window` samples them every millisecond
(registrations change without a slice changing), and :func:`longest` measures the longest run of
a condition: devices published with no instance registered (the window in which a claim fails
with "DRA driver ... is not registered"), or no device published (a gap in the pool).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from devicehost.standin.kubelet import KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn

State = tuple[float, bool, bool]
"""When (monotonic seconds), whether devices of the driver were published, whether the kubelet
had an instance of it registered."""


class Timeline(ClusterStandIn):
    """The API server stand-in, noting at each change the :data:`State` of ``driver`` (the
    registrations as ``registered()`` tells them: set it to the kubelet's)."""

    def __init__(self, driver: str) -> None:
        super().__init__()
        self.driver = driver
        self.registered: Callable[[], bool] = lambda: False
        self.changes: list[State] = []

    def _bump(self) -> None:
        self.changes.append((time.monotonic(), bool(self.devices(self.driver)), self.registered()))
        super()._bump()


class Window:
    """Samples the :data:`State` of ``driver`` every millisecond until :meth:`stop`."""

    def __init__(self, cluster: ClusterStandIn, kubelet: KubeletStandIn, driver: str) -> None:
        self.samples: list[State] = []
        self._task = asyncio.create_task(self._sample(cluster, kubelet, driver))

    async def _sample(self, cluster: ClusterStandIn, kubelet: KubeletStandIn, driver: str) -> None:
        while True:
            published = bool(cluster.devices(driver))
            self.samples.append((time.monotonic(), published, bool(kubelet.dra.endpoints(driver))))
            await asyncio.sleep(0.001)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def unregistered(published: bool, registered: bool) -> bool:
    """A claim could be placed that the kubelet cannot prepare."""
    return published and not registered


def missing(published: bool, registered: bool) -> bool:
    """No device of the driver is published."""
    return not published


def longest(states: Sequence[State], bad: Callable[[bool, bool], bool]) -> float:
    """The longest run of ``states`` in which ``bad(published, registered)`` holds, in seconds,
    from its first state to the next good one (a run still going at the end is not counted),
    counted from the first state with devices published."""
    longest_run, since, started = 0.0, None, False
    for at, published, registered in states:
        started = started or published
        if started and bad(published, registered):
            since = at if since is None else since
        elif since is not None:
            longest_run, since = max(longest_run, at - since), None
    return longest_run


@asynccontextmanager
async def noted_kubelet(root: Path, cluster: Timeline) -> AsyncIterator[KubeletStandIn]:
    """The kubelet stand-in on ``root / "dp"`` and ``root / "registry"``, whose registrations
    ``cluster`` notes at each change."""
    kubelet = KubeletStandIn(root / "dp", root / "registry")
    cluster.registered = lambda: bool(kubelet.dra.endpoints(cluster.driver))
    async with kubelet:
        yield kubelet
