"""The container runtime's side of CDI, as containerd 1.7 resolves a container's CDI device IDs.

containerd reads every spec in its CDI spec dirs (``/etc/cdi`` then ``/var/run/cdi``: a later
dir wins over an earlier one) and resolves each ID a container is given against them when it
creates the container. It is strict where it matters to a pod: a file it cannot parse, a spec of
an unknown ``cdiVersion``, an invalid kind or device name, a device without container edits or a
device named twice in one spec makes the whole spec count for nothing; two specs of one dir that
define the same device make that device unresolvable; and one ID that does not resolve fails the
container with ``CDI device injection failed: unresolvable CDI devices <ids>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from devicehost.cdi import kind_problem
from devicehost.hookspecs.rules import cdi_name_problem

KNOWN_VERSIONS = frozenset({"0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"})
"""The ``cdiVersion`` values the CDI library of containerd 1.7's era reads."""
SPEC_SUFFIXES = (".json", ".yaml")


class CdiUnresolvable(Exception):
    """Some CDI IDs resolve in no spec; the message is the runtime's."""


def spec_devices(spec: object) -> dict[str, Mapping[str, Any]] | None:
    """A parsed spec's devices by qualified name, with their container edits; None when the
    runtime would refuse the spec."""
    if not isinstance(spec, dict) or spec.get("cdiVersion") not in KNOWN_VERSIONS:
        return None
    kind = spec.get("kind")
    devices = spec.get("devices")
    if not isinstance(kind, str) or kind_problem(kind) or not isinstance(devices, list) or not devices:
        return None
    found: dict[str, Mapping[str, Any]] = {}
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        edits = device.get("containerEdits") if isinstance(device, dict) else None
        if not isinstance(name, str) or cdi_name_problem(f"{kind}={name}") or not edits:
            return None
        if f"{kind}={name}" in found:
            return None
        found[f"{kind}={name}"] = edits
    return found


def dir_devices(directory: Path) -> dict[str, Mapping[str, Any]]:
    """The devices the specs of one dir define; a device two specs define is left out."""
    found: dict[str, Mapping[str, Any]] = {}
    conflicts: set[str] = set()
    paths = sorted(directory.glob("*")) if directory.is_dir() else []
    for path in paths:
        if path.suffix not in SPEC_SUFFIXES or not path.is_file():
            continue
        try:
            devices = spec_devices(yaml.safe_load(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for name, edits in (devices or {}).items():
            if name in found:
                conflicts.add(name)
            found[name] = edits
    return {name: edits for name, edits in found.items() if name not in conflicts}


def registry(spec_dirs: Iterable[Path]) -> dict[str, Mapping[str, Any]]:
    """Every resolvable device of ``spec_dirs`` (lowest priority first) with its container edits."""
    found: dict[str, Mapping[str, Any]] = {}
    for directory in spec_dirs:
        found.update(dir_devices(Path(directory)))
    return found


def resolve(ids: Sequence[str], spec_dirs: Iterable[Path]) -> list[Mapping[str, Any]]:
    """The container edits of each of ``ids`` in order, as the runtime injects them; raises
    :class:`CdiUnresolvable` naming every ID that does not resolve."""
    found = registry(spec_dirs)
    unresolved = [i for i in ids if i not in found]
    if unresolved:
        raise CdiUnresolvable(f"unresolvable CDI devices {', '.join(unresolved)}")
    return [found[i] for i in ids]
