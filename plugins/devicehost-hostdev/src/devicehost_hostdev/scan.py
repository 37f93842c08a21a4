"""Matching the configured groups against the filesystem and sysfs, through a root directory.

Every scan reads the tree afresh: nothing is cached, so what a scan returns is what is on the
node (or in the fake tree under ``root``) right now.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from devicehost_hostdev.config import Group, PathEntry, ResourceConfig, UsbEntry
from devicehost_hostdev.ids import replica_ids

USB_DEVICES = "/sys/bus/usb/devices"


@dataclass(frozen=True)
class Node:
    """One matched file and how it reaches the container.

    :param host_path: the path on the node, without the root prefix.
    :param mount: bind-mount it (with ``read_only``) instead of exposing a device node
        (with ``permissions``).
    """

    host_path: str
    container_path: str
    mount: bool = False
    permissions: str = "rw"
    read_only: bool = False


@dataclass(frozen=True)
class FoundDevice:
    """One device as the tree shows it now.

    :param missing: the non-optional entries (patterns, USB selectors) that matched nothing;
        a device with any is Unhealthy.
    """

    id: str
    nodes: tuple[Node, ...]
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Match:
    """A node and the text its device ID derives from (its host path, or ``usb/<sysfs name>``)."""

    source: str
    node: Node


class Tree:
    """Reads host paths under ``root``."""

    def __init__(self, root: str) -> None:
        self._prefix = root.rstrip("/")

    def glob(self, pattern: str) -> list[str]:
        """The host paths matching ``pattern``, sorted."""
        matches = glob.glob(glob.escape(self._prefix) + pattern)
        return sorted(match[len(self._prefix) :] for match in matches)

    def exists(self, host_path: str) -> bool:
        return os.path.exists(self._prefix + host_path)

    def read(self, host_path: str) -> str | None:
        """The stripped text of a small file, or None when it cannot be read."""
        try:
            with open(self._prefix + host_path, encoding="utf-8", errors="replace") as file:
                return file.read().strip()
        except OSError:
            return None


def scan_resource(tree: Tree, resource: ResourceConfig) -> dict[str, FoundDevice]:
    """The resource's devices by ID; when two groups yield the same ID, the first group wins."""
    found: dict[str, FoundDevice] = {}
    for group in resource.groups:
        for device in _scan_group(tree, group):
            found.setdefault(device.id, device)
    return found


def _scan_group(tree: Tree, group: Group) -> list[FoundDevice]:
    matched = [(entry, _entry_matches(tree, entry)) for entry in group.entries]
    missing = tuple(entry.label for entry, matches in matched if not matches and not entry.optional)
    if group.split == "per_match":
        (_, primary), others = matched[0], matched[1:]
        shared = tuple(match.node for _, matches in others for match in matches)
        bases = [(match.source, (match.node, *shared)) for match in primary]
    else:
        nodes = tuple(match.node for _, matches in matched for match in matches)
        bases = [(_group_source(group), nodes)] if nodes else []
    return [
        FoundDevice(device_id, nodes, missing)
        for source, nodes in bases
        for device_id in replica_ids(source, group.count)
    ]


def _entry_matches(tree: Tree, entry: PathEntry | UsbEntry) -> list[_Match]:
    if isinstance(entry, UsbEntry):
        return [
            _Match(f"usb/{name}", Node(node, node, permissions=entry.permissions))
            for name, node in usb_devices(tree, entry)
        ]
    return [
        _Match(
            host_path,
            Node(
                host_path,
                entry.container_path or host_path,
                mount=entry.type == "mount",
                permissions=entry.permissions,
                read_only=entry.read_only,
            ),
        )
        for host_path in tree.glob(entry.path)
    ]


def usb_devices(tree: Tree, entry: UsbEntry) -> list[tuple[str, str]]:
    """(sysfs name, device node) of the plugged-in USB devices ``entry`` selects.

    A device matches when ``idVendor`` and ``idProduct`` (and ``serial``, when the entry sets
    one) agree and its node ``/dev/bus/usb/<busnum:03d>/<devnum:03d>`` exists.
    """
    found = []
    for device in tree.glob(f"{USB_DEVICES}/*"):
        if (tree.read(f"{device}/idVendor") or "").lower() != entry.vendor:
            continue
        if (tree.read(f"{device}/idProduct") or "").lower() != entry.product:
            continue
        if entry.serial is not None and tree.read(f"{device}/serial") != entry.serial:
            continue
        busnum, devnum = tree.read(f"{device}/busnum"), tree.read(f"{device}/devnum")
        if not (busnum and busnum.isdigit() and devnum and devnum.isdigit()):
            continue
        node = f"/dev/bus/usb/{int(busnum):03d}/{int(devnum):03d}"
        if tree.exists(node):
            found.append((os.path.basename(device), node))
    return found


def _group_source(group: Group) -> str:
    """What a ``split: none`` group's ID derives from: its first entry as configured."""
    first = group.entries[0]
    if isinstance(first, UsbEntry):
        return "/".join(filter(None, ["usb", first.vendor, first.product, first.serial]))
    return first.path
