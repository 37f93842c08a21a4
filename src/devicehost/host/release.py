"""Device release: tell a backend when the kubelet no longer assigns devices to any container.

The device plugin API has no Deallocate. The kubelet's pod-resources API lists which container
of which running pod holds each device; :class:`ReleaseTracker` looks at it whenever the
kubelet's checkpoint file in the device-plugins dir changes (the socket watch tells it of every
change in that dir) and every ``pod_resources_interval`` seconds anyway. A device listed before
and missing from two looks in a row (the second :data:`CONFIRM_DELAY` later, so a kubelet that
answers half-synced after a restart releases nothing) is released: the backend's
``devicehost_release`` is called once per device set its container held, while the host
advertises those devices Unhealthy. Allocations seen at the first look count like any other, so
devices allocated before the host started are released when their pods end.

A missing socket or a kubelet that does not answer pauses release (said once per change) and
changes nothing: only an answer from the kubelet can release a device.

Each look also tells every served resource's inventory what the device plugin side holds (what
the kubelet lists, and what it listed before and has not confirmed gone), so DRA cannot give out
a device, or a counter's amount, that a container holds; a device stays held while its release
hook runs. A device Allocate gave out counts as held from that moment
(:meth:`~devicehost.host.serving.table.DeviceTable.allocating`), until the kubelet lists it or
has not listed it within :data:`ALLOCATED_GRACE` seconds (a look that gets no answer keeps the
last answer's holds and lets go of what it never listed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import structlog

from devicehost.host.backends.backend import HookError
from devicehost.host.config import HostConfig
from devicehost.host.inventory import DEVICE_PLUGIN, RELEASE
from devicehost.host.kubelet.pod_resources import Holders, PodResourcesError, list_holders
from devicehost.host.kubelet.socket_watch import file_identity
from devicehost.host.serving.resource import ResourceServer
from devicehost.host.state import Holder, ResourceState

log = structlog.get_logger(__name__)

CHECKPOINT = "kubelet_internal_checkpoint"
"""The kubelet's device manager checkpoint, rewritten on every allocation and release."""
CONFIRM_DELAY = 1.0
"""Seconds until the look that confirms a device is gone."""
LIST_TIMEOUT = 5.0
ALLOCATED_GRACE = 10.0
"""Seconds a device Allocate gave out stays held without the kubelet listing it (its pod was
refused after the Allocate, or the kubelet is slow to list it)."""

DeviceKey = tuple[str, str]
"""(resource, device ID)."""


def released_sets(gone: Mapping[DeviceKey, Holder]) -> dict[tuple[str, Holder], tuple[str, ...]]:
    """Released devices grouped into the sets one container held, IDs sorted."""
    sets: dict[tuple[str, Holder], list[str]] = {}
    for (resource, device_id), holder in sorted(gone.items()):
        sets.setdefault((resource, holder), []).append(device_id)
    return {key: tuple(ids) for key, ids in sets.items()}


def missing(before: Holders, now: Holders) -> dict[DeviceKey, Holder]:
    """Devices held in ``before`` that no container holds in ``now``."""
    return {
        (resource, device_id): holder
        for resource, by_id in before.items()
        for device_id, holder in by_id.items()
        if device_id not in now.get(resource, {})
    }


def tracker_for(
    config: HostConfig, servers: Callable[[], Mapping[str, ResourceServer]]
) -> ReleaseTracker | None:
    """The host's tracker, or None when ``device_release`` is off."""
    if not config.device_release:
        return None
    return ReleaseTracker(
        config.pod_resources_socket, config.device_plugins_dir, config.pod_resources_interval, servers
    )


def with_holders(tracker: ReleaseTracker | None, state: ResourceState) -> ResourceState:
    """A resource's state with who holds its devices and how many releases it had."""
    if tracker is None:
        return state
    holders = dict(tracker.holders.get(state.name, {}))
    return replace(state, holders=holders, releases=tracker.releases[state.name])


class ReleaseTracker:
    """Follows pod-resources and runs the release hooks of the resources the host serves."""

    def __init__(
        self,
        socket: Path,
        device_plugins_dir: Path,
        interval: float,
        servers: Callable[[], Mapping[str, ResourceServer]],
    ) -> None:
        self.socket = socket
        self.checkpoint = device_plugins_dir / CHECKPOINT
        self.interval = interval
        self._servers = servers
        self.holders: Holders = {}
        """The latest answer: who holds which device."""
        self.releases: Counter[str] = Counter()
        """Device sets released, by resource."""
        self.status = "starting"
        self._seen: Holders = {}
        self._pending: dict[DeviceKey, Holder] = {}
        self._checkpoint_identity = file_identity(self.checkpoint)
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()

    def poke(self, changed: str | None = None) -> None:
        """A file in the device-plugins dir changed: look now if it was the checkpoint."""
        if changed not in (None, self.checkpoint.name):
            return
        identity = file_identity(self.checkpoint)
        if identity != self._checkpoint_identity:
            self._checkpoint_identity = identity
            self._wake.set()

    async def run(self) -> None:
        """Look until cancelled; release hooks still running are left to finish."""
        while True:
            self._wake.clear()
            try:
                await self.look()
            except Exception:  # release must never take the host down
                log.exception("device release look failed; looking again later")
            delay = CONFIRM_DELAY if self._pending else self.interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def look(self) -> None:
        """One List: remember the holders, release what two looks in a row found gone."""
        try:
            now = await list_holders(self.socket, LIST_TIMEOUT)
        except PodResourcesError as exc:
            self._say(f"paused: {exc}")
            self._follow()  # the last answer stands; what it never listed is let go after the grace
            return
        self._say("on")
        gone = missing(self._seen, now)
        confirmed = {key: holder for key, holder in gone.items() if self._pending.get(key) == holder}
        self._pending = {key: holder for key, holder in gone.items() if key not in confirmed}
        self.holders = now
        self._seen = {resource: dict(by_id) for resource, by_id in now.items()}
        for (resource, device_id), holder in self._pending.items():
            self._seen.setdefault(resource, {})[device_id] = holder
        for (resource, holder), ids in released_sets(confirmed).items():
            self._release(resource, holder, ids)
        self._follow()

    def _follow(self) -> None:
        """Tell each served resource's inventory what containers hold, as far as the kubelet said."""
        now = time.monotonic()
        for resource, server in self._servers().items():
            server.table.follow_pods(self._seen.get(resource, {}), now, ALLOCATED_GRACE)

    async def wait_idle(self) -> None:
        """Wait for the release hooks running now."""
        await asyncio.gather(*self._running, return_exceptions=True)

    def _say(self, status: str) -> None:
        if status != self.status:
            (log.info if status == "on" else log.warning)(
                "device release " + ("on" if status == "on" else status.replace("paused: ", "paused, ")),
                socket=str(self.socket),
            )
            self.status = status

    def _release(self, resource: str, holder: Holder, ids: tuple[str, ...]) -> None:
        server = self._servers().get(resource)
        if server is None or not server.backend.implements("devicehost_release"):
            return
        server.table.hold(RELEASE, DEVICE_PLUGIN, ids)  # held from now: no look or claim sees it free
        task = asyncio.create_task(self._run_hook(server, holder, ids), name=f"release {resource}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_hook(self, server: ResourceServer, holder: Holder, ids: tuple[str, ...]) -> None:
        server.log.info("releasing devices", devices=list(ids), was_held_by=str(holder))
        try:
            await server.backend.release(server.name, ids)
        except HookError as exc:
            server.log.error("release hook failed", devices=list(ids), error=str(exc))
        else:
            server.log.info("devices released", devices=list(ids))
        finally:
            server.table.hold(RELEASE, DEVICE_PLUGIN, ids, False)
            self.releases[server.name] += 1
