"""An in-memory NVML for tests and the conformance suite: GPUs, topology and events on demand.

Select it with a constructor argument (``NvidiaBackend(nvml=FakeNvml(...))``) or with the
settings ``nvml: fake`` and ``fake_gpus: [...]`` (see the README).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from devicehost_nvidia.nvml import (
    GPU_IS_LOST,
    NOT_SUPPORTED,
    EventKind,
    GpuEvent,
    GpuInfo,
    NvmlError,
    NvmlUnavailable,
)

_LIBRARY_NOT_FOUND = 12
_NOT_FOUND = 6
_UNKNOWN = 999


@dataclass(frozen=True)
class FakeGpu:
    """One fake GPU; ``numa_node`` None makes the backend fall back to sysfs."""

    uuid: str
    name: str = "NVIDIA Fake GPU"
    memory_bytes: int = 80 * 2**30
    minor: int = 0
    pci_bus_id: str = "0000:00:00.0"
    numa_node: int | None = 0
    nvlink_peers: tuple[str, ...] = ()
    events_supported: bool = True


def fake_gpus(count: int, numa_nodes: int = 1) -> list[FakeGpu]:
    """``count`` GPUs spread round-robin over ``numa_nodes`` nodes, no NVLink."""
    return [
        FakeGpu(
            uuid=f"GPU-00000000-0000-0000-0000-{n:012d}",
            minor=n,
            pci_bus_id=f"0000:{n + 1:02x}:00.0",
            numa_node=n * numa_nodes // count if count else 0,
        )
        for n in range(count)
    ]


class _FakeEventSet:
    """Counts an event as handled once the watcher asks for the next one (its loop is sequential)."""

    def __init__(self, owner: FakeNvml) -> None:
        self._owner = owner
        self.uuids: set[str] = set()
        self._queue: queue.Queue[GpuEvent] = queue.Queue()
        self._settled = threading.Condition()
        self._pending = 0
        self._handing_out = False

    def register(self, uuid: str) -> None:
        gpu = self._owner.gpu(uuid)
        if not gpu.events_supported:
            raise NvmlError(f"GPU {uuid} does not report events", NOT_SUPPORTED)
        self.uuids.add(uuid)

    def put(self, event: GpuEvent) -> None:
        with self._settled:
            self._pending += 1
        self._queue.put(event)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        with self._settled:
            if self._handing_out:
                self._pending -= 1
                self._handing_out = False
                self._settled.notify_all()
        try:
            event = self._queue.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None
        with self._settled:
            self._handing_out = True
        return event

    def settled(self, timeout: float) -> bool:
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout=timeout)

    def close(self) -> None:
        self._owner.forget(self)


class FakeNvml:
    """Behaves like NVML for the GPUs it was given; ``available=False`` acts as a node without driver."""

    def __init__(self, gpus: Iterable[FakeGpu] = (), *, available: bool = True) -> None:
        self._gpus = list(gpus)
        self._available = available
        self._lock = threading.Lock()
        self._lost: set[str] = set()
        self._event_sets: list[_FakeEventSet] = []
        self._broken = False
        self.scrubbed: list[str] = []
        """UUIDs of the GPUs scrubbed, in order."""

    def init(self) -> None:
        if not self._available:
            raise NvmlUnavailable("NVML Shared Library Not Found", _LIBRARY_NOT_FOUND)

    def driver_version(self) -> str:
        return "999.99.99-fake"

    def gpus(self) -> list[GpuInfo]:
        self._fail_if_broken()
        return [
            GpuInfo(n, g.uuid, g.name, g.memory_bytes, g.minor, g.pci_bus_id, g.numa_node)
            for n, g in enumerate(self._gpus)
        ]

    def gpu(self, uuid: str) -> FakeGpu:
        """The fake GPU with this UUID; NvmlError(NOT_FOUND) like NVML's handle lookup."""
        for gpu in self._gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NvmlError(f"no GPU {uuid}", _NOT_FOUND)

    def nvlink_peers(self, uuid_a: str, uuid_b: str) -> bool:
        return uuid_b in self.gpu(uuid_a).nvlink_peers or uuid_a in self.gpu(uuid_b).nvlink_peers

    def check(self, uuid: str) -> None:
        self.gpu(uuid)
        with self._lock:
            if uuid in self._lost:
                raise NvmlError(f"GPU {uuid} is lost", GPU_IS_LOST)

    def scrub(self, uuid: str) -> None:
        self.check(uuid)
        with self._lock:
            self.scrubbed.append(uuid)

    def event_set(self) -> _FakeEventSet:
        self._fail_if_broken()
        event_set = _FakeEventSet(self)
        with self._lock:
            self._event_sets.append(event_set)
        return event_set

    def forget(self, event_set: _FakeEventSet) -> None:
        """Drop a closed event set."""
        with self._lock:
            self._event_sets.remove(event_set)

    def _fail_if_broken(self) -> None:
        if self._broken:
            raise NvmlError("Unknown Error", _UNKNOWN)

    # Test controls.

    def set_broken(self, broken: bool = True) -> None:
        """Make GPU listing and event-set creation fail with an unknown NVML error."""
        self._broken = broken

    def set_available(self, available: bool) -> None:
        """Make the next ``init`` succeed or fail as if the driver were (not) loaded."""
        self._available = available

    def remove_gpu(self, uuid: str) -> None:
        """Make the GPU disappear from the next discovery."""
        with self._lock:
            self._gpus = [gpu for gpu in self._gpus if gpu.uuid != uuid]

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        """Make ``check`` fail for this GPU (fallen off the bus) or pass again."""
        with self._lock:
            (self._lost.add if lost else self._lost.discard)(uuid)

    def inject(self, uuid: str | None, kind: EventKind = EventKind.XID, data: int = 0) -> None:
        """Deliver an event to every open event set watching ``uuid`` (all of them for None)."""
        with self._lock:
            targets: Sequence[_FakeEventSet] = [
                s for s in self._event_sets if uuid is None or uuid in s.uuids
            ]
        for event_set in targets:
            event_set.put(GpuEvent(uuid, kind, data))

    def wait_handled(self, timeout: float = 5.0) -> bool:
        """Wait until every injected event was handled (the watcher asked for the next one)."""
        with self._lock:
            event_sets = list(self._event_sets)
        return all(event_set.settled(timeout) for event_set in event_sets)

    @property
    def open_event_sets(self) -> int:
        """How many event sets are open (a stopped watcher leaves none)."""
        with self._lock:
            return len(self._event_sets)
