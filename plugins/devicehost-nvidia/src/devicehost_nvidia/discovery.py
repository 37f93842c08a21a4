"""Finding the GPUs: the NVML the settings pick, initialised once, and what it last found.

Not thread-safe: the backend calls it with its lock held.
"""

from __future__ import annotations

import structlog

from devicehost_nvidia.config import Settings
from devicehost_nvidia.fake import FakeGpu, FakeNvml
from devicehost_nvidia.inventory import Inventory, discover, log_gpus
from devicehost_nvidia.nvml import Nvml, NvmlError, NvmlUnavailable, PynvmlNvml

_log = structlog.get_logger(__name__)


def nvml_from_settings(settings: Settings) -> Nvml:
    """The fake NVML with the configured GPUs for ``nvml: fake``, else the real one."""
    if settings.nvml == "fake":
        return FakeNvml(FakeGpu(**gpu.model_dump()) for gpu in settings.fake_gpus)
    return PynvmlNvml()


class GpuDiscovery:
    """The NVML in use and the last inventory; an NVML error keeps the GPUs found before.

    :param nvml: use this NVML whatever the settings say (tests: a FakeNvml).
    :param settings: the settings that pick the NVML when none is given.
    """

    def __init__(self, nvml: Nvml | None, settings: Settings) -> None:
        self._injected = nvml is not None
        self._nvml: Nvml = nvml if nvml is not None else nvml_from_settings(settings)
        self._initialized = False
        self._unavailable_logged = False
        self._inventory: Inventory | None = None

    @property
    def nvml(self) -> Nvml:
        return self._nvml

    @property
    def inventory(self) -> Inventory | None:
        """The last discovery; None before the first or after a settings change voided it."""
        return self._inventory

    def configure(self, old: Settings, new: Settings) -> None:
        """Follow a settings change: a new NVML when its source changed, rediscovery when the layout did."""
        source_changed = (new.nvml, new.fake_gpus) != (old.nvml, old.fake_gpus)
        layout_changed = (new.device_id_strategy, new.replicas) != (old.device_id_strategy, old.replicas)
        if not self._injected and source_changed:
            self._nvml = nvml_from_settings(new)
            self._initialized = False
            self._inventory = None
        if layout_changed:
            self._inventory = None

    def current(self, settings: Settings) -> Inventory | None:
        """The last inventory, or a fresh one when there is none yet."""
        return self._inventory or self.refresh(settings)

    def refresh(self, settings: Settings) -> Inventory | None:
        """Discover the GPUs again; None without NVML, the previous inventory on an NVML error."""
        if not self._ensure_nvml():
            return None
        previous = self._inventory
        inventory: Inventory | None
        try:
            inventory = discover(
                self._nvml,
                sysfs_root=settings.sysfs_root,
                strategy=settings.device_id_strategy,
                replicas=settings.replicas,
            )
            if previous is None or previous.gpus != inventory.gpus:
                log_gpus(inventory, self._nvml.driver_version())
        except NvmlError as error:
            _log.error("nvidia_discovery_failed", detail=str(error), keeping_previous=previous is not None)
            inventory = previous
        self._inventory = inventory
        return inventory

    def _ensure_nvml(self) -> bool:
        """Initialise NVML once; without it, log one line (until it comes back) and say False."""
        if self._initialized:
            return True
        try:
            self._nvml.init()
        except NvmlError as error:
            if not self._unavailable_logged:
                event = "nvml_unavailable" if isinstance(error, NvmlUnavailable) else "nvml_init_failed"
                _log.warning(event, detail=str(error), consequence="offering no NVIDIA GPUs until it loads")
                self._unavailable_logged = True
            return False
        if self._unavailable_logged:
            _log.info("nvml_available")
        self._initialized, self._unavailable_logged = True, False
        return True
