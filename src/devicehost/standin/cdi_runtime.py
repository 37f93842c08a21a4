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


def spec_problem(spec: object) -> str | None:
    """Why the runtime refuses a parsed spec (it then defines nothing); None: it reads it."""
    if not isinstance(spec, dict):
        return "not a mapping"
    version = spec.get("cdiVersion")
    if not isinstance(version, str):
        return "no cdiVersion"
    if version not in KNOWN_VERSIONS:
        return f"cdiVersion {version!r:.20} is not one the runtime reads"
    kind = spec.get("kind")
    problem = kind_problem(kind) if isinstance(kind, str) else "no kind"
    if problem:
        return problem
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        return "no devices"
    names: set[str] = set()
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or cdi_name_problem(f"{kind}={name}"):
            return f"device {name!r:.60} is not a valid CDI device name"
        if not device.get("containerEdits"):
            return f"device {name!r} has no container edits of its own"
        if name in names:
            return f"device {name!r} is named twice"
        names.add(name)
    return None


def spec_devices(spec: object) -> dict[str, Mapping[str, Any]] | None:
    """A parsed spec's devices by qualified name, each with the container edits it gives (the
    spec's own, then the device's); None when the runtime would refuse the spec."""
    if spec_problem(spec) is not None:
        return None
    assert isinstance(spec, dict)
    shared = spec.get("containerEdits") or {}
    return {f"{spec['kind']}={d['name']}": merged(shared, d["containerEdits"]) for d in spec["devices"]}


def merged(*edits: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Container edits applied one after the other, as the runtime applies a spec's, then a device's."""
    out: dict[str, list[Any]] = {}
    for one in edits:
        for kind, values in one.items():
            out.setdefault(kind, []).extend(values or [])
    return out


def definitions(directory: Path) -> tuple[dict[str, list[tuple[Path, Mapping[str, Any]]]], dict[Path, str]]:
    """Every device the specs of one dir define, each definition with its file and container
    edits, and the spec files the runtime refuses, with why."""
    defined: dict[str, list[tuple[Path, Mapping[str, Any]]]] = {}
    refused: dict[Path, str] = {}
    paths = sorted(directory.glob("*")) if directory.is_dir() else []
    for path in paths:
        if path.suffix not in SPEC_SUFFIXES or not path.is_file():
            continue
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            refused[path] = f"cannot be read: {' '.join(str(exc).split())[:120]}"
            continue
        devices = spec_devices(spec)
        if devices is None:
            refused[path] = spec_problem(spec) or ""
            continue
        for name, edits in devices.items():
            defined.setdefault(name, []).append((path, edits))
    return defined, refused


def dir_devices(directory: Path) -> dict[str, Mapping[str, Any]]:
    """The devices the specs of one dir define; a device two specs define is left out."""
    defined, _ = definitions(directory)
    return {name: found[0][1] for name, found in defined.items() if len(found) == 1}


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
