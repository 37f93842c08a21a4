"""The one seam to NVML: what the backend asks of the driver, and the pynvml calls behind it.

Everything else in the package talks to an :class:`Nvml` and sees plain Python values and
:class:`NvmlError`; only :class:`PynvmlNvml` imports ``pynvml``. Tests use
:class:`devicehost_nvidia.fake.FakeNvml` instead.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

# NVML return codes the backend tells apart (stable across NVML versions).
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_IN_USE = pynvml.NVML_ERROR_IN_USE
_UNAVAILABLE = {pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED}


class NvmlError(Exception):
    """An NVML call failed; ``code`` is NVML's return code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailable(NvmlError):
    """No NVML on this machine: the library is missing or the driver is not loaded."""


class EventKind(enum.Enum):
    """The NVML events the health watcher listens to."""

    XID = "xid"
    DOUBLE_BIT_ECC = "double_bit_ecc"


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event; ``uuid`` is None when NVML could not say which GPU it came from."""

    uuid: str | None
    kind: EventKind
    data: int


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as NVML describes it; ``numa_node`` is None when NVML cannot tell."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    minor: int
    pci_bus_id: str
    numa_node: int | None


class EventSet(Protocol):
    """GPUs registered for XID and double-bit ECC events."""

    def register(self, uuid: str) -> None:
        """Listen to this GPU's events; NvmlError(NOT_SUPPORTED) when it cannot report them."""

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """The next event, or None when none came within the timeout."""

    def close(self) -> None:
        """Free the event set."""


class Nvml(Protocol):
    """What the backend needs from NVML. Every method may raise NvmlError."""

    def init(self) -> None:
        """Load NVML (kept for the process's life); NvmlUnavailable without library or driver."""

    def driver_version(self) -> str:
        """The kernel driver's version."""

    def gpus(self) -> list[GpuInfo]:
        """Every GPU NVML sees, in NVML index order."""

    def nvlink_peers(self, uuid_a: str, uuid_b: str) -> bool:
        """Whether the two GPUs can talk peer to peer over NVLink (directly or via NVSwitch)."""

    def check(self, uuid: str) -> None:
        """Return when NVML still answers for this GPU; raise NvmlError when it does not."""

    def event_set(self) -> EventSet:
        """A new, empty event set."""

    def scrub(self, uuid: str) -> None:
        """Make a GPU no container uses any more fit for the next tenant; NvmlError when it is not."""


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs spells it: ``0000:3b:00.0``."""
    *domain, bus, device_function = bus_id.strip().lower().split(":")
    return f"{int(domain[0] if domain else '0', 16):04x}:{bus}:{device_function}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _wrap(error: Exception) -> NvmlError:
    code = int(getattr(error, "value", -1))
    cls = NvmlUnavailable if code in _UNAVAILABLE else NvmlError
    return cls(str(error), code)


class _PynvmlEventSet:
    """An NVML event set for XID critical errors and double-bit ECC errors."""

    _MASK = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def __init__(self) -> None:
        self._handle: Any = pynvml.nvmlEventSetCreate()

    def register(self, uuid: str) -> None:
        try:
            device = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(device))
            if not supported & self._MASK:
                raise NvmlError(f"GPU {uuid} reports neither XID nor ECC events", NOT_SUPPORTED)
            pynvml.nvmlDeviceRegisterEvents(device, self._MASK & supported, self._handle)
        except pynvml.NVMLError as error:
            raise _wrap(error) from error

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        try:
            data = pynvml.nvmlEventSetWait(self._handle, timeout_ms)
        except pynvml.NVMLError as error:
            if getattr(error, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise _wrap(error) from error
        kind = (
            EventKind.XID
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError
            else EventKind.DOUBLE_BIT_ECC
        )
        try:
            uuid: str | None = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            uuid = None
        return GpuEvent(uuid, kind, int(data.eventData))

    def close(self) -> None:
        try:
            pynvml.nvmlEventSetFree(self._handle)
        except pynvml.NVMLError as error:
            raise _wrap(error) from error


class PynvmlNvml:
    """The real NVML through ``pynvml`` (package ``nvidia-ml-py``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def init(self) -> None:
        with self._lock:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as error:
                raise _wrap(error) from error

    def driver_version(self) -> str:
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            raise _wrap(error) from error

    def gpus(self) -> list[GpuInfo]:
        try:
            return [self._gpu(index) for index in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as error:
            raise _wrap(error) from error

    @staticmethod
    def _gpu(index: int) -> GpuInfo:
        device = pynvml.nvmlDeviceGetHandleByIndex(index)
        return GpuInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(device)),
            name=_text(pynvml.nvmlDeviceGetName(device)),
            memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(device).total),
            minor=int(pynvml.nvmlDeviceGetMinorNumber(device)),
            pci_bus_id=normalize_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(device).busId)),
            numa_node=PynvmlNvml._numa_node(device),
        )

    @staticmethod
    def _numa_node(device: Any) -> int | None:
        # nvmlDeviceGetNumaNodeId is newer than the nvidia-ml-py floor and than some drivers.
        get_numa_node = getattr(pynvml, "nvmlDeviceGetNumaNodeId", None)
        if get_numa_node is None:
            return None
        try:
            node = int(get_numa_node(device))
        except pynvml.NVMLError:
            return None
        return node if node >= 0 else None

    def nvlink_peers(self, uuid_a: str, uuid_b: str) -> bool:
        try:
            status = pynvml.nvmlDeviceGetP2PStatus(
                pynvml.nvmlDeviceGetHandleByUUID(uuid_a),
                pynvml.nvmlDeviceGetHandleByUUID(uuid_b),
                pynvml.NVML_P2P_CAPS_INDEX_NVLINK,
            )
        except pynvml.NVMLError as error:
            if getattr(error, "value", None) == NOT_SUPPORTED:
                return False
            raise _wrap(error) from error
        return bool(status == pynvml.NVML_P2P_STATUS_OK)

    def check(self, uuid: str) -> None:
        try:
            device = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            pynvml.nvmlDeviceGetMemoryInfo(device)
        except pynvml.NVMLError as error:
            raise _wrap(error) from error

    def scrub(self, uuid: str) -> None:
        """Refuse while processes remain, then reset the clocks a tenant may have set.

        NVML has no public call that wipes memory or resets the whole GPU: a full reset is
        ``nvidia-smi --gpu-reset -i <uuid>`` (and needs the GPU idle); the driver clears memory
        on the next allocation of a context.
        """
        try:
            device = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            left = pynvml.nvmlDeviceGetComputeRunningProcesses(device)
            if left:
                raise NvmlError(f"GPU {uuid} still runs {len(left)} processes", _IN_USE)
            pynvml.nvmlDeviceResetApplicationsClocks(device)
        except pynvml.NVMLError as error:
            if getattr(error, "value", None) != NOT_SUPPORTED:
                raise _wrap(error) from error

    def event_set(self) -> EventSet:
        try:
            return _PynvmlEventSet()
        except pynvml.NVMLError as error:
            raise _wrap(error) from error
