"""A PCI device's PCIe root complex, as sysfs shows it: the standard DRA attribute
``resource.kubernetes.io/pcieRoot`` (``pci<domain>:<bus>``)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

SYSFS = Path("/sys")
"""Where sysfs is (a test points it at a directory of its own)."""
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


@functools.cache
def pcie_root(bus_id: str) -> str | None:
    """The root complex above ``bus_id`` (``/sys/bus/pci/devices/<bus id>`` links to
    ``/sys/devices/pci<domain>:<bus>/...``); None where sysfs does not have the device."""
    link = SYSFS / "bus" / "pci" / "devices" / bus_id
    if not link.exists():
        return None
    parts = Path(os.path.realpath(link)).parts
    return next((part for part in parts if _ROOT.fullmatch(part)), None)
