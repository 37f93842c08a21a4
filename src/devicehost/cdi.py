"""Describe a backend's devices as a CDI spec and hand the runtime their fully qualified names.

A backend builds a :class:`Spec` in ``devicehost_start``, writes it with :func:`write_spec`,
returns :func:`qualified_name` values as ``ContainerAllocation.cdi_devices`` from
``devicehost_allocate``, and calls :func:`remove_spec` in ``devicehost_stop``. The container
runtime (containerd >= 1.7 or CRI-O with CDI enabled) reads the spec from the same directory
and applies the device's container edits. Import the module, not its names: ``cdi.Device`` and
``cdi.Mount`` are not :class:`devicehost.Device` and :class:`devicehost.Mount`.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devicehost import _files
from devicehost.hookspecs.rules import cdi_name_problem
from devicehost.hookspecs.types import ContainerAllocation, keyword_only

# 0.5.0 added ``hostPath`` to device nodes and 0.6.0 allowed dots in a kind's class; every
# other field written here is older. A runtime rejects a spec whose version it does not know.
CDI_VERSION = "0.6.0"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
SPEC_MODE = 0o644
OCI_HOOKS = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)

__all__ = [
    "CDI_VERSION",
    "DEFAULT_CDI_DIR",
    "OCI_HOOKS",
    "SPEC_MODE",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Hook",
    "Mount",
    "Spec",
    "call_in_dir",
    "default_dir",
    "defined_names",
    "edits_from_allocation",
    "kind_problem",
    "move_spec",
    "qualified_name",
    "remove_spec",
    "set_default_dir",
    "spec_path",
    "spec_problem",
    "write_spec",
]

_default_dir = DEFAULT_CDI_DIR
"""The default of a process with no host in it (a backend's own tests): :func:`set_default_dir`."""
_host_dir: contextvars.ContextVar[Path | None] = contextvars.ContextVar("devicehost_cdi_dir", default=None)
"""The ``cdi_dir`` of the host calling a hook, set in that call's own context only."""
_ENV_NAME = re.compile(r"[^=\0]+")


def set_default_dir(path: str | os.PathLike[str]) -> None:
    """Set where :func:`write_spec` and :func:`remove_spec` go when given no directory, outside a
    host's hook calls (which get the host's ``cdi_dir``): for a backend's own tests."""
    global _default_dir
    _default_dir = Path(path)


def default_dir() -> Path:
    """Where :func:`write_spec` and :func:`remove_spec` go when given no directory: in a hook the
    host calls, the host's ``cdi_dir``; elsewhere what :func:`set_default_dir` set."""
    return _host_dir.get() or _default_dir


def call_in_dir(directory: Path, call: Callable[..., Any], /, **kwargs: Any) -> Any:
    """``call(**kwargs)`` with ``directory`` as :func:`default_dir`, set in the caller's own
    context only (the value never outlives the call). The host runs each hook call through it
    with its ``cdi_dir`` (the one it tells the backend in ``HostFacts.cdi_dir``), so a backend
    that writes specs without naming a dir writes them there too."""
    _host_dir.set(directory)
    return call(**kwargs)


@keyword_only
@dataclass(frozen=True, kw_only=True)
class DeviceNode:
    """A device node created in the container: ``DeviceNode(path=..., host_path=...)``.

    :param path: absolute path inside the container.
    :param host_path: absolute path of the node on the host; ``None`` means ``path``.
    :param permissions: cgroup permissions, any of ``r``, ``w`` and ``m``.
    """

    path: str
    host_path: str | None = None
    permissions: str = "rw"


@keyword_only
@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host path mounted into the container: ``Mount(host_path=..., container_path=...)``.

    Keyword-only, as :class:`devicehost.Mount` is: the two took their paths in opposite orders.

    :param host_path: absolute path on the host.
    :param container_path: absolute path inside the container.
    :param options: OCI mount options; keep ``bind`` (or ``rbind``) for a host path.
    """

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("bind",)


@dataclass(frozen=True)
class Hook:
    """An OCI hook the runtime runs for the container.

    :param hook_name: the OCI lifecycle point, one of :data:`OCI_HOOKS`.
    :param path: absolute path of the executable.
    :param args: its argv, ``args[0]`` included.
    :param env: its environment.
    :param timeout: seconds before the runtime gives up on it, > 0; ``None`` waits.
    """

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: int | None = None


@dataclass(frozen=True)
class ContainerEdits:
    """What the runtime changes in the container's OCI spec."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: Sequence[DeviceNode] = ()
    mounts: Sequence[Mount] = ()
    hooks: Sequence[Hook] = ()

    def to_dict(self) -> dict[str, Any]:
        """The CDI ``containerEdits`` object; empty lists are left out."""
        edits: dict[str, Any] = {
            "env": [f"{name}={value}" for name, value in self.env.items()],
            "deviceNodes": [_node_dict(node) for node in self.device_nodes],
            "mounts": [
                {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
                for m in self.mounts
            ],
            "hooks": [_hook_dict(hook) for hook in self.hooks],
        }
        return {key: value for key, value in edits.items() if value}


@dataclass(frozen=True)
class Device:
    """One CDI device: what a container gets when it is handed ``<kind>=<name>``.

    :param name: letters, digits, ``-``, ``_``, ``.`` and ``:``, starting and ending with a
        letter or digit; a device ID from discovery usually is one.
    :param edits: must not be empty: a runtime refuses a device without edits.
    """

    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class Spec:
    """A CDI spec: the devices of one kind, and the edits any of them brings along.

    :param kind: ``vendor.com/class``; a resource name such as ``example.com/widget`` is one.
    :param devices: at least one, names unique.
    :param edits: applied once to a container that gets any of the devices.
    """

    kind: str
    devices: Sequence[Device]
    edits: ContainerEdits = field(default_factory=ContainerEdits)

    def to_dict(self) -> dict[str, Any]:
        """The spec as the runtime reads it."""
        spec: dict[str, Any] = {
            "cdiVersion": CDI_VERSION,
            "kind": self.kind,
            "devices": [{"name": d.name, "containerEdits": d.edits.to_dict()} for d in self.devices],
        }
        shared = self.edits.to_dict()
        return {**spec, "containerEdits": shared} if shared else spec


def _node_dict(node: DeviceNode) -> dict[str, str]:
    host = {"hostPath": node.host_path} if node.host_path is not None else {}
    return {"path": node.path, **host, "permissions": node.permissions}


def _hook_dict(hook: Hook) -> dict[str, Any]:
    optional = {
        "args": list(hook.args),
        "env": [f"{name}={value}" for name, value in hook.env.items()],
        "timeout": hook.timeout,
    }
    return {"hookName": hook.hook_name, "path": hook.path, **{k: v for k, v in optional.items() if v}}


def kind_problem(kind: str) -> str | None:
    """The CDI rule ``kind`` breaks, or ``None``: a DNS subdomain, ``/``, then a class name."""
    vendor, _, class_name = kind.partition("/")
    # A kind is valid exactly when it qualifies a valid device name.
    if cdi_name_problem(f"{kind}=device"):
        return (
            f"CDI kind {kind!r} must be vendor.com/class: a DNS subdomain, '/', then letters, "
            "digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    if len(vendor) > 253 or len(class_name) > 63:
        return f"CDI kind {kind!r}: the vendor may be at most 253 characters and the class at most 63"
    return None


def qualified_name(kind: str, device: str) -> str:
    """``vendor.com/class=name``, the name a container is handed; ValueError when not valid."""
    problem = kind_problem(kind) or cdi_name_problem(f"{kind}={device}")
    if problem:
        raise ValueError(problem)
    return f"{kind}={device}"


def _edits_problem(edits: ContainerEdits) -> str | None:
    for name in [*edits.env, *(n for hook in edits.hooks for n in hook.env)]:
        if not _ENV_NAME.fullmatch(name):
            return f"environment variable name {name!r} must be non-empty, without '=' or NUL"
    paths = [
        *(p for node in edits.device_nodes for p in (node.path, node.host_path) if p is not None),
        *(p for mount in edits.mounts for p in (mount.host_path, mount.container_path)),
        *(hook.path for hook in edits.hooks),
    ]
    for path in paths:
        if not path.startswith("/"):
            return f"path {path!r} must be absolute"
    for node in edits.device_nodes:
        if not node.permissions or set(node.permissions) - set("rwm"):
            return f"device node {node.path!r}: permissions {node.permissions!r} must be made of r, w and m"
    for hook in edits.hooks:
        if hook.hook_name not in OCI_HOOKS:
            return f"hook {hook.path!r}: {hook.hook_name!r} is not one of {sorted(OCI_HOOKS)}"
        if hook.timeout is not None and hook.timeout <= 0:
            return f"hook {hook.path!r}: timeout {hook.timeout} must be > 0"
    return None


def spec_problem(spec: Spec) -> str | None:
    """The first CDI rule ``spec`` breaks, as one sentence, or ``None``."""
    problem = kind_problem(spec.kind)
    if problem:
        return problem
    if not spec.devices:
        return f"CDI spec {spec.kind!r} has no devices; remove it instead"
    names = [device.name for device in spec.devices]
    for device in spec.devices:
        if cdi_name_problem(f"{spec.kind}={device.name}"):
            return (
                f"CDI device name {device.name!r} must be letters, digits, '-', '_', '.' and ':', "
                "starting and ending with a letter or digit"
            )
        if names.count(device.name) > 1:
            return f"CDI device name {device.name!r} appears more than once"
        if not device.edits.to_dict():
            return f"CDI device {device.name!r} has no container edits; runtimes refuse such a device"
        problem = _edits_problem(device.edits)
        if problem:
            return f"CDI device {device.name!r}: {problem}"
    problem = _edits_problem(spec.edits)
    return f"CDI spec {spec.kind!r}: {problem}" if problem else None


def edits_from_allocation(allocation: ContainerAllocation) -> ContainerEdits:
    """The envs, mounts and device specs of an allocation as CDI edits.

    Its annotations and CDI names have no container edit: they stay on the allocation.
    """
    return ContainerEdits(
        env=dict(allocation.envs),
        device_nodes=[
            DeviceNode(path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in allocation.devices
        ],
        mounts=[
            Mount(
                host_path=m.host_path,
                container_path=m.container_path,
                options=("bind", "ro") if m.read_only else ("bind",),
            )
            for m in allocation.mounts
        ],
    )


def spec_path(kind: str, cdi_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the spec of ``kind`` goes: ``devicehost-<vendor>_<class>.json`` in ``cdi_dir``.

    A vendor has no ``_``, so two kinds never share a file.
    """
    problem = kind_problem(kind)
    if problem:
        raise ValueError(problem)
    directory = Path(cdi_dir) if cdi_dir is not None else default_dir()
    return directory / f"devicehost-{kind.replace('/', '_')}.json"


def write_spec(spec: Spec, cdi_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write ``spec`` atomically with mode 0644, replacing the kind's previous spec.

    The runtime sees the old file or the new one, never a part: the JSON goes to a hidden
    ``.tmp`` file beside it (runtimes read only ``.json`` and ``.yaml``), is synced, then
    renamed over it. Raises ValueError, naming the rule, for a spec the runtime would refuse.

    :param cdi_dir: the directory, created when missing; ``None`` means the host's
        ``cdi_dir`` (see :func:`set_default_dir`).
    :returns: the spec file's path.
    """
    problem = spec_problem(spec)
    if problem:
        raise ValueError(problem)
    path = spec_path(spec.kind, cdi_dir)
    _files.write_atomically(path, json.dumps(spec.to_dict(), indent=2) + "\n", SPEC_MODE)
    return path


def move_spec(kind: str, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> bool:
    """Move the spec of ``kind`` from the dir ``source`` to the dir ``target`` (written there as
    :func:`write_spec` writes, then removed from ``source``); False when ``source`` has none."""
    old = spec_path(kind, source)
    try:
        text = old.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    _files.write_atomically(spec_path(kind, target), text, SPEC_MODE)
    remove_spec(kind, source)
    return True


def remove_spec(kind: str, cdi_dir: str | os.PathLike[str] | None = None) -> None:
    """Remove the spec of ``kind``; nothing happens when there is none."""
    _files.remove(spec_path(kind, cdi_dir))


def defined_names(cdi_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Every fully qualified device name the specs in ``cdi_dir`` define, with its spec file.

    Reads ``.json`` and ``.yaml`` files as a runtime does; a file it cannot parse defines
    nothing (a runtime skips it too). ``None`` means the host's ``cdi_dir``.
    """
    import yaml  # here, not at module level: every backend imports this module via devicehost

    directory = Path(cdi_dir) if cdi_dir is not None else default_dir()
    names: dict[str, Path] = {}
    for path in sorted(directory.glob("*")):
        if path.suffix not in (".json", ".yaml") or not path.is_file():
            continue
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
            continue
        for device in spec["devices"]:
            if isinstance(device, dict) and isinstance(device.get("name"), str):
                names[f"{spec.get('kind')}={device['name']}"] = path
    return names
