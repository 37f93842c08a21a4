"""Each prepared claim's CDI spec (``host/dra/specs.py``): written and removed in the host
context's live ``cdi_dir``, moved there after a reload changed it, and written again where a
reboot emptied the dir, so the runtime (its stand-in here) still resolves the claim's devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog

from devicehost import cdi
from devicehost.hookspecs.types import ClaimRequest, ContainerAllocation, DeviceSpec
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.dra.allocated import ClaimRefused, Request
from devicehost.host.dra.checkpoint import PreparedClaim, PreparedDevice
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
    cdi.write_spec(cdi.Spec(kind=specs.kind(UID), devices=claim_devices()), specs.directory)
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


def request(name: str, *ids: str) -> Request:
    """A request of the resource ``example.com/widget`` for the devices ``ids``, as planned."""
    planned = tuple(PreparedDevice(name, "node-a", i, "example.com/widget", i, ()) for i in ids)
    unused: Any = None  # where it is published: the spec does not need it
    return Request("example.com/widget", unused, (), ClaimRequest(name, "default/c", UID), None, planned)


def test_the_hooks_answers_become_the_claims_spec_and_each_requests_cdi_ids(tmp_path: Path) -> None:
    specs = ClaimSpecs(DRIVER, HostContext(HostConfig(cdi_dir=tmp_path)), structlog.get_logger())
    edited = ContainerAllocation(
        envs={"WIDGET": "w0"},
        devices=[DeviceSpec(container_path="/dev/widget0", host_path="/dev/null", permissions="rw")],
        cdi_devices=["vendor.com/widget=w0", "vendor.com/widget=w0"],
    )
    named_only = ContainerAllocation(cdi_devices=["vendor.com/widget=w1"])
    requests = [request("a", "w0", "w2"), request("b", "w1")]
    devices, spec = specs.written(UID, requests, [edited, named_only])
    own = f"{KIND}=a.widget"
    assert [(d.device_id, d.cdi_ids) for d in devices] == [
        ("w0", ("vendor.com/widget=w0", own)),  # the backend's own first, each once; then the spec's
        ("w2", ()),  # the request's first device carries its IDs
        ("w1", ("vendor.com/widget=w1",)),  # no edits: nothing of the claim's spec
    ]
    written = cdi.Device("a.widget", cdi.edits_from_allocation(edited))
    assert spec == cdi.Spec(kind=KIND, devices=[written]).to_dict()
    (edits,) = resolve([own], [tmp_path])  # what the runtime gives the container
    assert (edits["env"], edits["deviceNodes"][0]["path"]) == (["WIDGET=w0"], "/dev/widget0")

    assert specs.written("other", [request("b", "w1")], [named_only])[1] is None  # no edits: no spec
    assert not cdi.spec_path(f"{DRIVER}/claim-other", tmp_path).exists()


def test_a_spec_that_cannot_be_written_refuses_the_claim(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    specs = ClaimSpecs(DRIVER, HostContext(HostConfig(cdi_dir=tmp_path / "file")), structlog.get_logger())
    with pytest.raises(ClaimRefused, match=r"^CDI spec for the claim: "):
        specs.written(UID, [request("a", "w0")], [ContainerAllocation(envs={"A": "1"})])
