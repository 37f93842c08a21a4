"""Each prepared claim's CDI spec (``<driver>/claim-<uid>``) in the host's live ``cdi_dir``
(and, after a reload, its device metadata's: ``<driver>/metadata-<uid>``).

:class:`ClaimSpecs` writes and removes them where the host context says now, and after a
reload that changed ``cdi_dir`` moves those of the prepared claims there, so a container
started again finds its claim's devices where the runtime reads now. The runtime resolves a
claim's CDI IDs when the container starts, possibly after a node reboot emptied
``/var/run/cdi`` (a tmpfs): so a spec the checkpoint keeps is written again where it is missing
or differs (:meth:`ClaimSpecs.ensure`) before the kubelet is told the claim is prepared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ContainerAllocation
from devicehost.host.dra import names
from devicehost.host.dra.allocated import ClaimRefused, Request
from devicehost.host.dra.checkpoint import PreparedClaim, PreparedDevice

if TYPE_CHECKING:
    from devicehost.host.context import HostContext


class ClaimSpecs:
    """One driver's claim specs; ``context`` None: ``devicehost.cdi``'s default dir."""

    def __init__(
        self, driver: str, context: HostContext | None, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        self._driver = driver
        self._context = context
        self._log = log
        self._where = self.directory
        """Where the prepared claims' specs are: the dir they were last written or moved to."""

    @property
    def directory(self) -> Path | None:
        """Where a claim's spec goes now: the host's live ``cdi_dir``."""
        return None if self._context is None else self._context.config.cdi_dir

    def kind(self, uid: str) -> str:
        return names.cdi_kind(self._driver, uid)

    def written(
        self, uid: str, requests: Sequence[Request], given: Sequence[ContainerAllocation]
    ) -> tuple[tuple[PreparedDevice, ...], dict[str, Any] | None]:
        """The claim's devices, the first of each request carrying the CDI IDs its containers get
        (the backend's own, then the device of the claim's spec that the hook's edits became),
        and that spec as written (None: no request has edits, and no spec is written).

        :raises ClaimRefused: the spec could not be written.
        """
        for allocation in given:
            if allocation.annotations:  # no CDI edit and no place in the DRA answer
                self._log.debug(
                    "allocation annotations are not passed on through DRA",
                    annotations=list(allocation.annotations),
                )
        kind = self.kind(uid)
        device_names = [names.cdi_device_name(r.asked.name, r.resource) for r in requests]
        edits = [cdi.edits_from_allocation(allocation) for allocation in given]
        spec_devices: list[cdi.Device] = []
        devices: list[PreparedDevice] = []
        for request, allocation, name, edit in zip(requests, given, device_names, edits, strict=True):
            ids = tuple(allocation.cdi_devices)
            if edit.to_dict():  # the hook's edits become a device of the claim's spec
                spec_devices.append(cdi.Device(name, edit))
                ids = (*ids, f"{kind}={name}")
            first = replace(request.planned[0], cdi_ids=tuple(dict.fromkeys(ids)))  # each ID once
            devices.extend((first, *request.planned[1:]))
        if not spec_devices:
            return tuple(devices), None
        spec = cdi.Spec(kind=kind, devices=spec_devices)
        try:
            written = spec.to_dict()
            cdi.write_spec(spec, self.directory)
        except (OSError, ValueError) as exc:
            raise ClaimRefused(f"CDI spec for the claim: {exc}") from None
        return tuple(devices), written

    def ensure(self, claim: PreparedClaim) -> bool:
        """Write the claim's spec, as the checkpoint keeps it, again where it is missing or
        differs; whether it was written. :raises OSError, ValueError: it could not be written."""
        if claim.spec is None:
            return False
        try:
            same = json.loads(cdi.spec_path(self.kind(claim.uid), self.directory).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            same = None
        if same == claim.spec:
            return False
        cdi.write_spec(spec_from_dict(claim.spec), self.directory)
        return True

    def remove(self, uid: str) -> None:
        """Remove the claim's spec (none there: nothing happens)."""
        cdi.remove_spec(self.kind(uid), self.directory)

    def follow(self, prepared: Iterable[str]) -> None:
        """Move the specs of the ``prepared`` claims (UIDs) to ``cdi_dir`` if it changed since:
        each claim's own, and its device metadata's where it has one."""
        source, target = self._where, self.directory
        if source is None or target is None or source == target:
            return
        for uid in prepared:
            try:
                cdi.move_spec(self.kind(uid), source, target)
                cdi.move_spec(names.metadata_kind(self._driver, uid), source, target)
            except (OSError, ValueError) as exc:
                self._log.error("claim's CDI spec not moved to the new cdi_dir", uid=uid, error=str(exc))
        self._where = target
        self._log.info("prepared claims' CDI specs moved", source=str(source), target=str(target))


def spec_from_dict(spec: Mapping[str, Any]) -> cdi.Spec:
    """The :class:`cdi.Spec` a claim's spec (as :meth:`cdi.Spec.to_dict` gave it) was made from."""
    return cdi.Spec(
        kind=spec["kind"],
        devices=[cdi.Device(d["name"], edits_from_dict(d["containerEdits"])) for d in spec["devices"]],
        edits=edits_from_dict(spec.get("containerEdits", {})),
    )


def edits_from_dict(edits: Mapping[str, Any]) -> cdi.ContainerEdits:
    """The container edits of a claim's spec (env, device nodes and mounts: all it ever has)."""
    return cdi.ContainerEdits(
        env=dict(line.partition("=")[::2] for line in edits.get("env", ())),
        device_nodes=[
            cdi.DeviceNode(path=n["path"], host_path=n.get("hostPath"), permissions=n["permissions"])
            for n in edits.get("deviceNodes", ())
        ],
        mounts=[
            cdi.Mount(host_path=m["hostPath"], container_path=m["containerPath"], options=tuple(m["options"]))
            for m in edits.get("mounts", ())
        ],
    )
