"""A prepared claim's own CDI spec (``<driver>/claim-<uid>``) on disk: what the checkpoint keeps of
it, whether the file says the same, and writing it again when it does not.

The runtime resolves a claim's CDI IDs when the container starts, possibly long after the
kubelet got the prepare answer and after a node reboot emptied ``/var/run/cdi`` (a tmpfs), so
what the checkpoint says is prepared must be on disk again before the kubelet is told so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devicehost import cdi
from devicehost.host.dra import names
from devicehost.host.dra.checkpoint import PreparedClaim


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


def spec_path(driver: str, uid: str, cdi_dir: Path | None) -> Path:
    """Where the claim ``uid``'s spec is."""
    return cdi.spec_path(names.cdi_kind(driver, uid), cdi_dir)


def on_disk(claim: PreparedClaim, path: Path) -> bool:
    """Whether ``path`` holds the claim's spec as the checkpoint keeps it (none kept: nothing to hold)."""
    if claim.spec is None:
        return True
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")) == claim.spec)
    except (OSError, ValueError):
        return False


def ensure(claim: PreparedClaim, driver: str, cdi_dir: Path | None) -> bool:
    """Write the claim's spec again where it is missing or differs; whether it was written.
    Raises OSError or ValueError when it cannot be."""
    path = spec_path(driver, claim.uid, cdi_dir)
    if claim.spec is None or on_disk(claim, path):
        return False
    cdi.write_spec(spec_from_dict(claim.spec), cdi_dir)
    return True


def remove(driver: str, uid: str, cdi_dir: Path | None) -> None:
    """Remove the claim's spec (none there: nothing happens)."""
    cdi.remove_spec(names.cdi_kind(driver, uid), cdi_dir)
