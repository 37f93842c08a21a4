"""What was discovered: the GPUs, their NUMA nodes and NVLink peers, and the device IDs advertised."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from devicehost_nvidia.nvml import GpuInfo, Nvml

REPLICA_SEPARATOR = "::"

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Gpu:
    """A discovered GPU; ``numa_node`` is from NVML, else sysfs, else None."""

    info: GpuInfo
    numa_node: int | None

    @property
    def uuid(self) -> str:
        return self.info.uuid


def sysfs_numa_node(sysfs_root: str, pci_bus_id: str) -> int | None:
    """``<root>/bus/pci/devices/<bus id>/numa_node``; None when missing, unreadable or -1."""
    path = Path(sysfs_root, "bus", "pci", "devices", pci_bus_id, "numa_node")
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


@dataclass(frozen=True)
class Inventory:
    """The GPUs and, for each advertised device ID, the GPU behind it."""

    gpus: tuple[Gpu, ...]
    gpu_of: Mapping[str, Gpu]
    nvlinks: frozenset[frozenset[str]] = field(default_factory=frozenset)

    def ids_of(self, uuid: str) -> list[str]:
        """The device IDs (replicas) advertised for one GPU."""
        return [device_id for device_id, gpu in self.gpu_of.items() if gpu.uuid == uuid]

    def nvlinked(self, uuid_a: str, uuid_b: str) -> bool:
        return frozenset((uuid_a, uuid_b)) in self.nvlinks


def device_ids(gpu: Gpu, strategy: str, replicas: int) -> list[str]:
    """``<uuid>`` or ``<index>``, suffixed ``::<n>`` per replica when time-slicing."""
    base = gpu.uuid if strategy == "uuid" else str(gpu.info.index)
    if replicas == 1:
        return [base]
    return [f"{base}{REPLICA_SEPARATOR}{n}" for n in range(replicas)]


def discover(nvml: Nvml, *, sysfs_root: str, strategy: str, replicas: int) -> Inventory:
    """Ask NVML for the GPUs and their NVLink peers; fill NUMA nodes from sysfs where needed."""
    gpus = tuple(
        Gpu(
            info,
            info.numa_node if info.numa_node is not None else sysfs_numa_node(sysfs_root, info.pci_bus_id),
        )
        for info in nvml.gpus()
    )
    nvlinks = frozenset(
        frozenset((a.uuid, b.uuid))
        for a, b in itertools.combinations(gpus, 2)
        if nvml.nvlink_peers(a.uuid, b.uuid)
    )
    gpu_of = {device_id: gpu for gpu in gpus for device_id in device_ids(gpu, strategy, replicas)}
    return Inventory(gpus, gpu_of, nvlinks)


def log_gpus(inventory: Inventory, driver: str) -> None:
    """One line per GPU, at discovery."""
    for gpu in inventory.gpus:
        _log.info(
            "nvidia_gpu",
            index=gpu.info.index,
            uuid=gpu.uuid,
            model=gpu.info.name,
            memory_mib=gpu.info.memory_bytes // 2**20,
            minor=gpu.info.minor,
            pci_bus_id=gpu.info.pci_bus_id,
            numa_node=gpu.numa_node,
            nvlink_peers=sorted(
                other.info.index for other in inventory.gpus if inventory.nvlinked(gpu.uuid, other.uuid)
            ),
            driver=driver,
        )
