"""Each prepared claim's CDI spec (``host/dra/specs.py``): written and removed in the host
context's live ``cdi_dir``, moved there after a reload changed it, and written again where a
reboot emptied the dir, so the runtime (its stand-in here) still resolves the claim's devices."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from devicehost import cdi
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.dra.checkpoint import PreparedClaim
from devicehost.host.dra.specs import ClaimSpecs, spec_from_dict
from devicehost.standin.cdi_runtime import CdiUnresolvable, resolve

DRIVER = "example.com"
UID = "0a1b"
KIND = f"{DRIVER}/claim-{UID}"


def claim_devices() -> list[cdi.Device]:
    edits = cdi.ContainerEdits(
        env={"WIDGET": "w0"},
        device_nodes=[cdi.DeviceNode(path="/dev/widget0", host_path="/dev/null", permissions="rw")],
        mounts=[cdi.Mount(host_path="/opt/w", container_path="/w", options=("ro", "bind"))],
    )
    return [cdi.Device("req-widget", edits)]


def test_a_spec_is_written_moved_after_a_reload_and_removed(tmp_path: Path) -> None:
    context = HostContext(HostConfig(cdi_dir=tmp_path / "a"))
    specs = ClaimSpecs(DRIVER, context, structlog.get_logger())
    specs.write(UID, claim_devices())
    (edits,) = resolve([f"{KIND}=req-widget"], [tmp_path / "a"])
    assert edits["env"] == ["WIDGET=w0"]

    context.config = context.config.model_copy(update={"cdi_dir": tmp_path / "b"})
    assert specs.directory == tmp_path / "b"
    specs.follow([UID])
    assert resolve([f"{KIND}=req-widget"], [tmp_path / "b"]) == [edits]  # where the runtime reads now
    with pytest.raises(CdiUnresolvable):
        resolve([f"{KIND}=req-widget"], [tmp_path / "a"])

    specs.remove(UID)
    specs.remove(UID)  # none there: nothing happens
    assert not cdi.spec_path(KIND, tmp_path / "b").exists()


def test_a_reload_moves_a_claims_device_metadata_spec_too(tmp_path: Path) -> None:
    context = HostContext(HostConfig(cdi_dir=tmp_path / "a"))
    specs = ClaimSpecs(DRIVER, context, structlog.get_logger())
    metadata = f"{DRIVER}/metadata-{UID}"
    mount = cdi.Mount(host_path="/m.json", container_path="/var/run/m.json", options=("bind", "ro"))
    spec = cdi.Spec(kind=metadata, devices=[cdi.Device("req.metadata", cdi.ContainerEdits(mounts=[mount]))])
    cdi.write_spec(spec, tmp_path / "a")
    context.config = context.config.model_copy(update={"cdi_dir": tmp_path / "b"})
    specs.follow([UID])
    (edits,) = resolve([f"{metadata}=req.metadata"], [tmp_path / "b"])
    assert edits["mounts"][0]["containerPath"] == "/var/run/m.json"
    assert not cdi.spec_path(metadata, tmp_path / "a").exists()


def test_a_kept_spec_is_written_again_only_where_missing_or_different(tmp_path: Path) -> None:
    specs = ClaimSpecs(DRIVER, HostContext(HostConfig(cdi_dir=tmp_path)), structlog.get_logger())
    kept = cdi.Spec(kind=KIND, devices=claim_devices()).to_dict()
    assert spec_from_dict(kept).to_dict() == kept  # what the checkpoint keeps gives the same spec
    claim = PreparedClaim(UID, "default", "c", (), spec=kept)
    assert specs.ensure(claim)  # a reboot emptied the dir
    assert resolve([f"{KIND}=req-widget"], [tmp_path])[0]["deviceNodes"][0]["path"] == "/dev/widget0"
    assert not specs.ensure(claim)  # there and the same
    cdi.spec_path(KIND, tmp_path).write_text("{}")
    assert specs.ensure(claim)  # changed under it
    assert not specs.ensure(PreparedClaim(UID, "default", "c", ()))  # no spec of its own kept
