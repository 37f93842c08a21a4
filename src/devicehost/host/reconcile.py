"""Discovery against what is served: a pure plan of what to add, withdraw, update and refuse.

A backend whose discovery failed (``None``) keeps what it serves. A resource that breaks the
kubelet's rules, is offered twice, or is served for another backend is refused with the rule
named; if its backend already serves it, it keeps being served as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Resource


@dataclass(frozen=True)
class Refusal:
    """A discovered resource the host will not serve, and why."""

    backend: str
    resource: str
    problem: str


@dataclass(frozen=True)
class Plan:
    """What one discovery round changes."""

    add: tuple[tuple[str, Resource], ...] = ()
    """(backend, resource) to start serving."""
    withdraw: tuple[str, ...] = ()
    """Served resources to stop serving."""
    update: tuple[Resource, ...] = ()
    """Served resources as rediscovered (devices, counter sets)."""
    refused: tuple[Refusal, ...] = ()


def _problem(
    backend: str, resource: Resource, offered: Mapping[str, str], served: Mapping[str, str]
) -> str | None:
    if not isinstance(resource.name, str):
        return "name is not a string"
    problem = rules.resource_name_problem(resource.name) or rules.devices_problem(resource.devices)
    if problem is None and resource.name in offered:
        problem = f"resource {resource.name!r} is already offered by backend {offered[resource.name]!r}"
    owner = served.get(resource.name)
    if problem is None and owner is not None and owner != backend:
        problem = f"resource {resource.name!r} is already served for backend {owner!r}"
    return problem


def plan(discovered: Sequence[tuple[str, Sequence[Resource] | None]], served: Mapping[str, str]) -> Plan:
    """Compare one discovery of every backend with what is served.

    :param discovered: (backend, its resources, or None when its discovery failed), in backend order.
    :param served: the backend of every served resource, by resource name.
    """
    wanted: dict[str, tuple[str, Resource]] = {}
    offered: dict[str, str] = {}
    kept: set[str] = set()
    failed: set[str] = set()
    refused: list[Refusal] = []
    for backend, resources in discovered:
        if resources is None:
            failed.add(backend)
            continue
        for resource in resources:
            problem = _problem(backend, resource, offered, served)
            if problem is None:
                wanted[resource.name] = (backend, resource)
                offered[resource.name] = backend
                continue
            refused.append(Refusal(backend, str(resource.name)[:300], problem))
            if isinstance(resource.name, str) and served.get(resource.name) == backend:
                kept.add(resource.name)
    return Plan(
        add=tuple((b, r) for name, (b, r) in wanted.items() if name not in served),
        withdraw=tuple(
            name
            for name, owner in served.items()
            if name not in wanted and name not in kept and owner not in failed
        ),
        update=tuple(r for name, (_, r) in wanted.items() if name in served),
        refused=tuple(refused),
    )
