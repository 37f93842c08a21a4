"""The settings schema (``backends.hostdev`` in the host config file) and its validation.

Pydantic checks each field on its own; :func:`_cross_field_problems` then checks the rules that
span fields. Every problem becomes one line of a ``ValueError`` that names the resource and the
field, such as ``resources[0] (example.com/serial).groups[0].paths[0].path: must be absolute``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pydantic

from devicehost.hookspecs import rules

GLOB_CHARACTERS = frozenset("*?[")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


def has_glob(path: str) -> bool:
    """Whether ``path`` is a pattern rather than one plain path."""
    return not GLOB_CHARACTERS.isdisjoint(path)


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("must be absolute")
    return path


def _permissions(permissions: str) -> str:
    if not permissions or not set(permissions) <= set("rwm"):
        raise ValueError("must be one or more of r, w and m, such as rw")
    return permissions


def _usb_id(value: object) -> str:
    if not isinstance(value, str) or not _HEX4.fullmatch(value):
        raise ValueError('must be a quoted string of 4 hex digits, such as "0403"')
    return value.lower()


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


class PathEntry(_Model):
    """A host path or glob, handed to the container as a device node or as a bind mount."""

    path: str
    type: Literal["device", "mount"] = "device"
    container_path: str | None = None
    permissions: str = "rw"
    read_only: bool = False
    optional: bool = False

    _check_path = pydantic.field_validator("path")(_absolute)
    _check_permissions = pydantic.field_validator("permissions")(_permissions)

    @pydantic.field_validator("container_path")
    @classmethod
    def _check_container_path(cls, value: str | None) -> str | None:
        if value is not None and has_glob(value):
            raise ValueError("must be a plain path, not a glob")
        return value if value is None else _absolute(value)

    @property
    def label(self) -> str:
        """The path as configured, for messages."""
        return self.path


class UsbEntry(_Model):
    """USB devices matched in sysfs by vendor and product ID, and serial number when given."""

    vendor: str
    product: str
    serial: str | None = None
    permissions: str = "rw"
    optional: bool = False

    _check_ids = pydantic.field_validator("vendor", "product", mode="before")(_usb_id)
    _check_permissions = pydantic.field_validator("permissions")(_permissions)

    @pydantic.field_validator("serial")
    @classmethod
    def _check_serial(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def label(self) -> str:
        """``usb 0403:6001`` (with ``serial A1B2`` when set), for messages."""
        serial = f" serial {self.serial}" if self.serial else ""
        return f"usb {self.vendor}:{self.product}{serial}"


class Group(_Model):
    """What one device is made of, and how many device IDs share it."""

    paths: list[PathEntry] = []
    usb: list[UsbEntry] = []
    split: Literal["per_match", "none"] = "per_match"
    count: int = 1

    @pydantic.field_validator("count")
    @classmethod
    def _check_count(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @property
    def entries(self) -> tuple[PathEntry | UsbEntry, ...]:
        """Paths first, then USB selectors: the first one decides a ``per_match`` group's devices."""
        return (*self.paths, *self.usb)


class ResourceConfig(_Model):
    """One extended resource and the groups that make up its devices."""

    name: str
    groups: list[Group]

    @pydantic.field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        problem = rules.resource_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @pydantic.field_validator("groups")
    @classmethod
    def _check_groups(cls, value: list[Group]) -> list[Group]:
        if not value:
            raise ValueError("needs at least one group")
        return value


class Settings(_Model):
    """The whole ``backends.hostdev`` mapping."""

    root: str = "/"
    resources: list[ResourceConfig] = []

    _check_root = pydantic.field_validator("root")(_absolute)

    def resource(self, name: str) -> ResourceConfig | None:
        """The configured resource called ``name``, if any."""
        return next((resource for resource in self.resources if resource.name == name), None)


def parse_settings(settings: Mapping[str, Any]) -> Settings:
    """Validate ``settings``; raise ``ValueError`` listing every problem, one per line."""
    try:
        parsed = Settings.model_validate(dict(settings))
    except pydantic.ValidationError as error:
        problems = [
            f"{_location(settings, err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
            for err in error.errors()
        ]
    else:
        problems = [f"{where}: {what}" for where, what in _cross_field_problems(parsed)]
    if problems:
        raise ValueError("\n".join(problems))
    return parsed


def _location(settings: Mapping[str, Any], loc: Sequence[int | str]) -> str:
    """``('resources', 0, 'groups', 1)`` -> ``resources[0] (its name).groups[1]``."""
    parts: list[str] = []
    for position, part in enumerate(loc):
        if isinstance(part, str):
            parts.append(part)
        elif position == 1 and loc[0] == "resources":
            parts[-1] = _resource_label(settings, part)
        else:
            parts[-1] += f"[{part}]"
    return ".".join(parts) or "settings"


def _resource_label(settings: Mapping[str, Any], index: int) -> str:
    """``resources[0] (example.com/serial)``, the name left out when it is not a string."""
    resources = settings.get("resources")
    entry = resources[index] if isinstance(resources, list) and index < len(resources) else None
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f"resources[{index}] ({name})" if isinstance(name, str) else f"resources[{index}]"


def _cross_field_problems(settings: Settings) -> Iterator[tuple[str, str]]:
    """The rules that span fields, as (location, problem) pairs."""
    first_index: dict[str, int] = {}
    for r, resource in enumerate(settings.resources):
        where = f"resources[{r}] ({resource.name})"
        if resource.name in first_index:
            yield f"{where}.name", f"duplicate of resources[{first_index[resource.name]}]"
        first_index.setdefault(resource.name, r)
        for g, group in enumerate(resource.groups):
            yield from _group_problems(f"{where}.groups[{g}]", group)


def _group_problems(where: str, group: Group) -> Iterator[tuple[str, str]]:
    if not group.entries:
        yield where, "needs at least one entry in paths or usb"
        return
    first = group.entries[0]
    first_where = f"{where}.paths[0]" if group.paths else f"{where}.usb[0]"
    if group.split == "per_match" and first.optional:
        yield f"{first_where}.optional", "must be false: the first entry decides a per_match group's devices"
    for p, entry in enumerate(group.paths):
        entry_where = f"{where}.paths[{p}]"
        if entry.type == "mount" and "permissions" in entry.model_fields_set:
            yield f"{entry_where}.permissions", "only for type device"
        if entry.type == "device" and "read_only" in entry.model_fields_set:
            yield f"{entry_where}.read_only", "only for type mount"
        one_match_per_device = not has_glob(entry.path) or (group.split == "per_match" and p == 0)
        if entry.container_path is not None and not one_match_per_device:
            yield (
                f"{entry_where}.container_path",
                "needs a plain path, or the first path of a per_match group",
            )
