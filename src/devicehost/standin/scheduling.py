"""The scheduler's side of the in-memory API server: DeviceClasses, DeviceTaintRules, allocation.

:class:`Scheduling` is the part of :class:`~devicehost.standin.apiserver.ApiServerStandIn` that
allocates claims from its stored slices as the scheduler does (:mod:`devicehost.standin.allocator`):
:meth:`~Scheduling.allocate_claim` takes a ResourceClaim's ``spec`` as a test or a manifest writes
it (:meth:`~Scheduling.allocate_claims`: those of one pod, together); :meth:`~Scheduling.allocate`
builds one (:func:`claim_spec`) from a driver and a count, the short form tests and
``--simulate-kubelet`` use.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from devicehost.resourceapi import ClaimAllocation
from devicehost.standin.allocator import Unschedulable, allocate_together

__all__ = ["Scheduling", "Unschedulable", "claim_spec", "driver_class"]


class Scheduling:
    """DeviceClasses, DeviceTaintRules and claims allocated from the ``stored`` slices."""

    claims: dict[tuple[str, str], ClaimAllocation]
    specs: dict[str, Mapping[str, Any]]
    stored: dict[str, dict[str, Any]]

    @functools.cached_property
    def classes(self) -> dict[str, dict[str, Any]]:
        """DeviceClasses by name (as JSON), which claims name."""
        return {}

    @functools.cached_property
    def taint_rules(self) -> dict[str, dict[str, Any]]:
        """DeviceTaintRules by name (as JSON): their taints are on the devices they select."""
        return {}

    def allocate(
        self,
        driver: str,
        count: int = 1,
        *,
        namespace: str = "default",
        name: str = "",
        request: str = "req",
        config: Mapping[str, Any] | None = None,
        admin_access: bool = False,
        devices: Sequence[str] = (),
        consumed: Mapping[str, str] | None = None,
    ) -> tuple[str, str, str]:
        """Allocate ``count`` devices of ``driver`` to a new claim as the scheduler would; its
        (namespace, uid, name).

        The claim (:func:`claim_spec`) asks for ``request`` of the DeviceClass named after the
        driver (every device of it, where no such class is stored): ``request/subrequest`` is a
        prioritized list's choice, ``config`` the claim's opaque parameters for the request,
        ``consumed`` its capacity requests; an ``admin_access`` claim may take devices other
        claims hold. ``devices`` narrows the choice to these slice device names: a shortcut of the
        stand-in's (a claim on a cluster names a device with a CEL selector), after which the
        scheduler's every rule still applies.

        :raises Unschedulable: the scheduler would not allocate it.
        """
        spec = claim_spec(driver, count, request, config, admin_access, consumed)
        classes = {driver: driver_class(driver), **self.classes}
        return self.allocate_claim(spec, namespace=namespace, name=name, classes=classes, devices=devices)

    def allocate_claim(
        self,
        spec: Mapping[str, Any],
        *,
        namespace: str = "default",
        name: str = "",
        classes: Mapping[str, Mapping[str, Any]] | None = None,
        devices: Sequence[str] = (),
        node: str | None = None,
    ) -> tuple[str, str, str]:
        """Allocate a new claim of ``spec`` (a ResourceClaim's ``spec``, as JSON) from the stored
        slices, :attr:`classes` (or ``classes``) and :attr:`taint_rules`, as the scheduler does
        (on ``node``; None: the first node where it fits); its (namespace, uid, name).
        ``devices``: as for :meth:`allocate`.

        :raises Unschedulable: the scheduler would not allocate it, with its event's message.
        """
        (ref,) = self.allocate_claims(
            [(name, spec)], namespace=namespace, classes=classes, devices=devices, node=node
        )
        return ref

    def allocate_claims(
        self,
        named: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        namespace: str = "default",
        classes: Mapping[str, Mapping[str, Any]] | None = None,
        devices: Sequence[str] = (),
        node: str | None = None,
    ) -> list[tuple[str, str, str]]:
        """Allocate new claims of one pod together, as the scheduler does: all of them or none;
        ``named`` are their (name, spec) ("": a generated name), the result their (namespace,
        uid, name) in order. Other parameters as for :meth:`allocate_claim`.

        :raises Unschedulable: the scheduler would not allocate them, with its event's message.
        """
        slices = [_only(body, devices) for body in self.stored.values()] if devices else self.stored.values()
        allocations = allocate_together(
            [spec for _, spec in named],
            slices=slices,
            classes=self.classes if classes is None else classes,
            claims=self.claims.values(),
            taint_rules=self.taint_rules.values(),
            node=node,
        )
        refs = []
        for (name, spec), allocation in zip(named, allocations, strict=True):
            uid = str(uuid.uuid4())
            name = name or f"claim-{uid[:8]}"
            self.specs[uid] = spec
            self.claims[(namespace, name)] = ClaimAllocation(uid, allocation.devices, allocation.configs)
            refs.append((namespace, uid, name))
        return refs


def driver_class(driver: str) -> dict[str, Any]:
    """The DeviceClass of every device of ``driver`` (the one the deploy manifests install)."""
    expression = f"device.driver == {driver!r}"
    return {"metadata": {"name": driver}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def claim_spec(
    driver: str,
    count: int = 1,
    request: str = "req",
    config: Mapping[str, Any] | None = None,
    admin_access: bool = False,
    consumed: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim's ``spec`` asking for ``count`` devices of the class named ``driver``
    for ``request`` (``request/subrequest``: the one subrequest of a prioritized list)."""
    main, _, sub = request.partition("/")
    exactly: dict[str, Any] = {"deviceClassName": driver, "count": count}
    if admin_access:
        exactly["adminAccess"] = True
    if consumed:
        exactly["capacity"] = {"requests": dict(consumed)}
    body = (
        {"name": main, "firstAvailable": [{"name": sub, **exactly}]}
        if sub
        else {"name": main, "exactly": exactly}
    )
    devices: dict[str, Any] = {"requests": [body]}
    if config is not None:
        devices["config"] = [{"requests": [main], "opaque": {"driver": driver, "parameters": dict(config)}}]
    return {"devices": devices}


def _only(body: Mapping[str, Any], devices: Sequence[str]) -> Mapping[str, Any]:
    """The slice with only the ``devices`` named (its counters kept)."""
    kept = [d for d in body["spec"].get("devices") or () if d["name"] in devices]
    return {**body, "spec": {**body["spec"], "devices": kept}}
