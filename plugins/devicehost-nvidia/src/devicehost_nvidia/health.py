"""GPU health: an NVML event thread for XID and double-bit ECC errors, and recovery checks.

A GPU turns Unhealthy on a critical XID (one not in ``ignored_xids``), on a double-bit ECC
error, on an event NVML cannot attribute (then every GPU), and when NVML stops answering for it.
It turns Healthy again once NVML answers for it and nothing bad happened for
``recovery_interval`` seconds; with ``recovery_interval=None`` it stays Unhealthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping

import structlog

from devicehost import Health
from devicehost_nvidia.nvml import NOT_SUPPORTED, EventKind, EventSet, GpuEvent, Nvml, NvmlError

_log = structlog.get_logger(__name__)

HealthCallback = Callable[[Mapping[str, Health]], None]


class HealthWatcher:
    """Watches a fixed set of GPUs (by UUID) and reports health changes to ``on_change``."""

    def __init__(
        self,
        nvml: Nvml,
        uuids: Iterable[str],
        *,
        ignored_xids: Collection[int],
        recovery_interval: float | None,
        on_change: HealthCallback,
        clock: Callable[[], float] = time.monotonic,
        wait_ms: int = 1000,
        initial: Mapping[str, Health] | None = None,
    ) -> None:
        self._nvml = nvml
        self._ignored_xids = frozenset(ignored_xids)
        self._recovery_interval = recovery_interval
        self._on_change = on_change
        self._clock = clock
        self._wait_ms = wait_ms
        self._lock = threading.Lock()
        self._health = {uuid: Health.HEALTHY for uuid in uuids}
        self._last_bad: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: EventSet | None = None
        for uuid, health in (initial or {}).items():
            if uuid in self._health and health is Health.UNHEALTHY:
                self._health[uuid] = Health.UNHEALTHY
                self._last_bad[uuid] = clock()

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(self._health)

    def start(self) -> None:
        """Register the GPUs for events and start the thread; a second call does nothing."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            try:
                event_set = self._nvml.event_set()
            except NvmlError as error:
                _log.error("nvidia_event_set_failed", detail=str(error), fallback="health polls only")
                return
            self._event_set = event_set
            self._thread = threading.Thread(target=self._run, name="devicehost-nvidia-health", daemon=True)
        for uuid in self._health:
            try:
                event_set.register(uuid)
            except NvmlError as error:
                if error.code == NOT_SUPPORTED:
                    _log.warning("nvidia_events_not_supported", uuid=uuid, detail=str(error))
                else:
                    self._mark_bad([uuid], f"event registration failed: {error}")
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and free the event set; safe to call more than once."""
        with self._lock:
            thread, event_set = self._thread, self._event_set
            self._thread = self._event_set = None
        if thread is None or event_set is None:
            return
        self._stop.set()
        thread.join()
        try:
            event_set.close()
        except NvmlError as error:
            _log.warning("nvidia_event_set_free_failed", detail=str(error))

    def current(self) -> dict[str, Health]:
        """Every GPU's health as last known, without checking."""
        with self._lock:
            return dict(self._health)

    def health(self) -> dict[str, Health]:
        """Run the checks now (NVML answers; recovery due) and return every GPU's health."""
        now = self._clock()
        failed: dict[str, str] = {}
        for uuid in self._health:
            try:
                self._nvml.check(uuid)
            except NvmlError as error:
                failed[uuid] = str(error)
        for uuid, reason in failed.items():
            self._mark_bad([uuid], f"NVML does not answer: {reason}")
        with self._lock:
            recovered = {
                uuid: Health.HEALTHY
                for uuid, health in self._health.items()
                if health is Health.UNHEALTHY
                and uuid not in failed
                and self._recovery_interval is not None
                and now - self._last_bad.get(uuid, now) >= self._recovery_interval
            }
            if recovered:
                _log.info("nvidia_gpu_recovered", uuids=sorted(recovered))
                self._health.update(recovered)
                self._on_change(recovered)
            return dict(self._health)

    def handle(self, event: GpuEvent) -> None:
        """Apply one NVML event."""
        if event.kind is EventKind.XID and event.data in self._ignored_xids:
            _log.info("nvidia_xid_ignored", uuid=event.uuid, xid=event.data)
            return
        what = f"XID {event.data}" if event.kind is EventKind.XID else "double-bit ECC error"
        if event.uuid is None:
            self._mark_bad(list(self._health), f"{what} on an unknown GPU")
        elif event.uuid in self._health:
            self._mark_bad([event.uuid], what)

    def _mark_bad(self, uuids: list[str], reason: str) -> None:
        with self._lock:
            now = self._clock()
            changed = {uuid: Health.UNHEALTHY for uuid in uuids if self._health[uuid] is Health.HEALTHY}
            self._last_bad.update(dict.fromkeys(uuids, now))
            self._health.update(changed)
            if changed:
                _log.warning("nvidia_gpu_unhealthy", uuids=sorted(changed), reason=reason)
                self._on_change(changed)

    def _run(self) -> None:
        event_set = self._event_set
        assert event_set is not None
        while not self._stop.is_set():
            try:
                event = event_set.wait(self._wait_ms)
            except NvmlError as error:
                self._mark_bad(list(self._health), f"waiting for NVML events failed: {error}")
                self._stop.wait(self._wait_ms / 1000)
                continue
            if event is not None:
                self.handle(event)
            self.health()
