"""A driver's start replays its claims checkpoint: specs written again, the backend told of each
prepared claim, calls cut short finished, a refusal unpreparing that claim alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drafakes import CountingCluster, attached, fake_server

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, cdi
from devicehost.host.dra.checkpoint import Checkpoint, Phase, PreparedClaim, PreparedDevice
from devicehost.host.dra.claims import Claims
from devicehost.host.dra.restore import by_request, open_claims, restore_resource

DRIVER = "example.com"
WIDGET = "example.com/widget"
POOL = "node-a/widget"
CARDS = [Device(f"w{n}") for n in range(4)]


@pytest.fixture(autouse=True)
def cdi_dir(tmp_path: Path) -> Iterator[Path]:
    previous = cdi.default_dir()
    cdi.set_default_dir(tmp_path / "cdi")
    yield tmp_path / "cdi"
    cdi.set_default_dir(previous)


class Restoring:
    """Records release and restore hooks; ``refuse`` makes restore raise."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.restored: list[tuple[tuple[str, ...], str, Any]] = []
        self.released: list[tuple[str, ...]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [devicehost.Resource(WIDGET, tuple(CARDS))]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"W": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, device_ids: tuple[str, ...]) -> None:
        self.released.append(device_ids)

    @devicehost.hookimpl
    def devicehost_restore(self, device_ids: tuple[str, ...], claim: ClaimRequest) -> None:
        if self.refuse:
            raise RuntimeError("the partition is gone")
        self.restored.append((device_ids, claim.uid, claim.config))


def card(device_id: str, request: str = "req") -> PreparedDevice:
    return PreparedDevice(request, POOL, device_id, WIDGET, device_id, ())


def a_spec(uid: str) -> dict[str, Any]:
    edits = cdi.ContainerEdits(env={"W": "w0"})
    return cdi.Spec(kind=f"{DRIVER}/claim-{uid}", devices=[cdi.Device("req.widget", edits)]).to_dict()


def checkpoint_of(path: Path, *claims: PreparedClaim) -> None:
    written = Checkpoint(path)
    for claim in claims:
        written.add(claim)


async def test_a_start_restores_prepared_claims_and_finishes_those_cut_short(
    tmp_path: Path, cdi_dir: Path
) -> None:
    path = tmp_path / "claims.json"
    checkpoint_of(
        path,
        PreparedClaim("u1", "default", "c1", (card("w0"),), Phase.PREPARED, a_spec("u1"), {"req": {"x": 1}}),
        PreparedClaim("u2", "default", "c2", (card("w1"),), Phase.PREPARING),
        PreparedClaim("u3", "default", "c3", (card("w2"),), Phase.UNPREPARING),
        PreparedClaim("u4", "default", "c4", (card("w3"),), Phase.RELEASED),
    )
    plugin = Restoring()
    with fake_server(plugin, CARDS) as server:
        claims = Claims(DRIVER, CountingCluster(), Checkpoint(path), {WIDGET: attached(server, POOL)})
        open_claims(claims)
        spec = cdi_dir / f"devicehost-{DRIVER}_claim-u1.json"
        assert json.loads(spec.read_text()) == a_spec("u1")  # written again before any backend call
        assert plugin.restored == plugin.released == []
        await restore_resource(claims, WIDGET)
        await restore_resource(claims, WIDGET)  # attached again: nothing twice
    assert plugin.restored == [(("w0",), "u1", {"x": 1})]
    assert sorted(plugin.released) == [("w1",), ("w2",)]  # the released claim is not released again
    again = Checkpoint(path)
    assert again.load() is None
    assert list(again.claims) == ["u1"]
    assert (claims.restored, claims.not_restored) == ({"u1", "u2", "u3", "u4"}, {})


async def test_a_backend_that_refuses_to_restore_a_claim_unprepares_it_alone(
    tmp_path: Path, cdi_dir: Path
) -> None:
    path = tmp_path / "claims.json"
    checkpoint_of(path, PreparedClaim("u1", "default", "c1", (card("w0"),), Phase.PREPARED, a_spec("u1")))
    plugin = Restoring(refuse=True)
    with fake_server(plugin, CARDS) as server:
        claims = Claims(DRIVER, CountingCluster(), Checkpoint(path), {WIDGET: attached(server, POOL)})
        open_claims(claims)
        await restore_resource(claims, WIDGET)
    assert plugin.released == [("w0",)]
    assert "the partition is gone" in claims.not_restored["u1"]
    assert not (cdi_dir / f"devicehost-{DRIVER}_claim-u1.json").exists()
    assert claims.checkpoint.claims == {}


def test_by_request_groups_a_claims_devices_in_order() -> None:
    claim = PreparedClaim("u", "default", "c", (card("w1", "a"), card("w0", "b"), card("w2", "a")))
    assert [(q, [d.device_id for d in ds]) for _, q, ds in by_request(claim)] == [
        ("a", ["w1", "w2"]),
        ("b", ["w0"]),
    ]
