"""Preparing and unpreparing claims (``host/dra/claims.py``) with a fake API server, a real
checkpoint, and a real Backend and DeviceTable behind a fake resource server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
from drafakes import (
    CountingCluster,
    FakeServer,
    ModelRecorder,
    Recorder,
    attached,
    fake_server,
    widgets,
)
from pydantic import BaseModel, ConfigDict

from devicehost import Capacity, Device, Health, Share, cdi
from devicehost.hookspecs import rules
from devicehost.host.dra import claims as claims_module
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim
from devicehost.host.dra.claims import Claims
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation, OpaqueConfig
from devicehost.host.dra.slices import device_entry
from devicehost.host.inventory import DEVICE_PLUGIN, PODS
from devicehost.resourceapi import claim_allocation

DRIVER = "example.com"
WIDGET = "example.com/widget"
POOL = "node-a/widget"


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval: int = 1


class GpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strategy: Literal["TimeSlicing", "SpacePartitioning"] = "TimeSlicing"
    sharing: Sharing = Sharing()


@pytest.fixture(autouse=True)
def cdi_dir(tmp_path: Path) -> Iterator[Path]:
    """Every test's claim specs go to its own dir: a test that asks for no dir writes none elsewhere."""
    previous = cdi.default_dir()
    cdi.set_default_dir(tmp_path / "cdi")
    yield tmp_path / "cdi"
    cdi.set_default_dir(previous)


class Rig:
    """One driver's Claims over one widget resource, and the claims on the fake API server."""

    def __init__(
        self, cluster: CountingCluster, claims: Claims, server: FakeServer, plugin: Recorder
    ) -> None:
        self.cluster = cluster
        self.claims = claims
        self.server = server
        self.plugin = plugin

    def claim(
        self,
        name: str,
        *devices: tuple[str, str],
        configs: tuple[OpaqueConfig, ...] = (),
        admin: bool = False,
        pool: str = POOL,
        driver: str = DRIVER,
    ) -> tuple[str, str, str]:
        """A claim of (request, device) devices as the scheduler allocates it; its (ns, uid, name)."""
        uid = f"uid-{name}"
        allocated = tuple(AllocatedDevice(r, driver, pool, d, admin) for r, d in devices)
        self.cluster.claims[("default", name)] = ClaimAllocation(uid, allocated, configs)
        return "default", uid, name

    async def prepared(self, *refs: tuple[str, str, str]) -> list[PreparedClaim]:
        """Prepare ``refs`` in one call; every one must have prepared."""
        answers = await self.claims.prepare(refs)
        for ref in refs:
            assert isinstance(answers[ref[1]], PreparedClaim), answers[ref[1]]
        return [answers[ref[1]] for ref in refs]  # type: ignore[misc]

    def advertised_unhealthy(self) -> set[str]:
        return {d.id for d in self.server.table.advertised() if d.health is Health.UNHEALTHY}


@asynccontextmanager
async def rig_of(
    tmp_path: Path,
    plugin: Recorder | None = None,
    devices: list[Device] | None = None,
    holds: dict[str, frozenset[str]] | None = None,
) -> AsyncIterator[Rig]:
    plugin = plugin or Recorder()
    async with AsyncExitStack() as stack:
        server = stack.enter_context(fake_server(plugin, devices or [Device(f"w{n}") for n in range(4)]))
        cluster = CountingCluster()
        checkpoint = Checkpoint(tmp_path / "driver" / "claims.json")
        assert checkpoint.load() is None
        claims = Claims(
            DRIVER,
            cluster,
            checkpoint,
            {WIDGET: attached(server, POOL)},
        )
        for resource, held in (holds or {}).items():
            assert resource == WIDGET
            server.table.hold(PODS, DEVICE_PLUGIN, held)
        yield Rig(cluster, claims, server, plugin)


def asked(plugin: Recorder) -> list[tuple[tuple[str, ...], str, Any, bool]]:
    """Each allocate call as (device IDs, request name, config, admin access)."""
    found = []
    for _, ids, claim in plugin.allocated:
        assert claim is not None
        found.append((ids, claim.name, claim.config, claim.admin_access))
    return found


# -- configuration -------------------------------------------------------------------------


async def test_each_request_gets_its_configuration_in_api_order(tmp_path: Path, cdi_dir: Path) -> None:
    configs = (
        OpaqueConfig(DRIVER, {"from": "class"}),  # a DeviceClass's: every request
        OpaqueConfig(DRIVER, {"from": "claim, gpu"}, ("gpu",)),
        OpaqueConfig("other.org", {"from": "another driver"}),  # later, but not this driver's
        OpaqueConfig(DRIVER, {"from": "claim, gpu, last"}, ("gpu",)),  # later wins
        OpaqueConfig(DRIVER, {"from": "claim, fallback"}, ("fallback",)),  # names the main request
    )
    async with rig_of(tmp_path) as rig:
        ref = rig.claim("c", ("gpu", "w0"), ("aux", "w1"), ("fallback/older", "w2"), configs=configs)
        await rig.prepared(ref)
        assert asked(rig.plugin) == [
            (("w0",), "gpu", {"from": "claim, gpu, last"}, False),
            (("w1",), "aux", {"from": "class"}, False),
            (("w2",), "fallback/older", {"from": "claim, fallback"}, False),
        ]
        (_, _, first) = rig.plugin.allocated[0]
        assert first is not None
        assert (first.claim, first.uid) == ("default/c", "uid-c")


async def test_a_request_no_config_names_gets_none(tmp_path: Path, cdi_dir: Path) -> None:
    async with rig_of(tmp_path) as rig:
        ref = rig.claim("c", ("gpu", "w0"), configs=(OpaqueConfig(DRIVER, {"x": 1}, ("other",)),))
        await rig.prepared(ref)
        assert asked(rig.plugin) == [(("w0",), "gpu", None, False)]


async def test_the_backends_model_checks_the_config_and_reaches_the_hook(
    tmp_path: Path, cdi_dir: Path
) -> None:
    plugin = ModelRecorder(config_model=GpuConfig)
    async with rig_of(tmp_path, plugin) as rig:
        params = {"strategy": "SpacePartitioning", "sharing": {"interval": 3}}
        ref = rig.claim("c", ("gpu", "w0"), configs=(OpaqueConfig(DRIVER, params),))
        await rig.prepared(ref)
        ((_, _, claim),) = plugin.allocated
        assert claim is not None
        assert claim.config == GpuConfig(strategy="SpacePartitioning", sharing=Sharing(interval=3))


async def test_a_config_the_model_refuses_fails_that_claim_only(tmp_path: Path, cdi_dir: Path) -> None:
    plugin = ModelRecorder(config_model=GpuConfig)
    async with rig_of(tmp_path, plugin) as rig:
        bad = rig.claim(
            "bad",
            ("gpu", "w0"),
            configs=(OpaqueConfig(DRIVER, {"sharing": {"interval": "often"}}, ("gpu",)),),
        )
        good = rig.claim("good", ("gpu", "w1"), configs=(OpaqueConfig(DRIVER, {"strategy": "TimeSlicing"}),))
        answers = await rig.claims.prepare([bad, good])
        error = answers[bad[1]]
        assert isinstance(error, str)
        assert "request 'gpu'" in error
        assert "parameters.sharing.interval" in error  # the key path
        assert "\n" not in error
        assert isinstance(answers[good[1]], PreparedClaim)
        assert [ids for _, ids, _ in plugin.allocated] == [("w1",)]  # no allocate hook for the bad one
        assert plugin.released == []
        assert set(rig.claims.checkpoint.claims) == {good[1]}
        assert rig.advertised_unhealthy() == {"w1"}


async def test_an_unknown_config_key_is_named(tmp_path: Path, cdi_dir: Path) -> None:
    plugin = ModelRecorder(config_model=GpuConfig)
    async with rig_of(tmp_path, plugin) as rig:
        ref = rig.claim("c", ("gpu/older", "w0"), configs=(OpaqueConfig(DRIVER, {"stratgy": "TimeSlicing"}),))
        error = (await rig.claims.prepare([ref]))[ref[1]]
        assert isinstance(error, str)
        assert "request 'gpu/older'" in error
        assert "parameters.stratgy" in error
        assert "strategy" in error
        assert plugin.allocated == []


# -- admin access --------------------------------------------------------------------------


async def test_admin_access_reaches_the_hook(tmp_path: Path, cdi_dir: Path) -> None:
    async with rig_of(tmp_path) as rig:
        admin = rig.claim("admin", ("gpu", "w0"), admin=True)
        normal = rig.claim("normal", ("gpu", "w1"))
        await rig.prepared(admin, normal)
        assert [(ids, flag) for ids, _, _, flag in asked(rig.plugin)] == [(("w0",), True), (("w1",), False)]
        assert rig.claims.checkpoint.claims[admin[1]].devices[0].admin_access is True


@pytest.mark.parametrize("first_gone", ["admin", "normal"])
async def test_a_shared_device_is_released_once_by_its_last_holder(
    tmp_path: Path, cdi_dir: Path, first_gone: str
) -> None:
    """Issue 24: deleting the admin pod scrubbed widget-0 while the normal claim still held it."""
    async with rig_of(tmp_path) as rig:
        refs = {
            "normal": rig.claim("normal", ("gpu", "w0")),
            "admin": rig.claim("admin", ("gpu", "w0"), admin=True),
        }
        await rig.prepared(refs["normal"])
        await rig.prepared(refs["admin"])
        assert rig.advertised_unhealthy() == {"w0"}
        last_gone = "normal" if first_gone == "admin" else "admin"

        assert await rig.claims.unprepare([refs[first_gone]]) == {refs[first_gone][1]: ""}
        assert rig.plugin.released == []  # the other claim still holds w0
        assert rig.advertised_unhealthy() == {"w0"}  # and the device plugin side still may not hand it out
        assert set(rig.claims.checkpoint.claims) == {refs[last_gone][1]}

        assert await rig.claims.unprepare([refs[last_gone]]) == {refs[last_gone][1]: ""}
        assert rig.plugin.released == [(WIDGET, ("w0",))]
        assert rig.advertised_unhealthy() == set()
        assert rig.claims.checkpoint.claims == {}


async def test_claims_sharing_a_device_in_one_unprepare_release_it_once(
    tmp_path: Path, cdi_dir: Path
) -> None:
    async with rig_of(tmp_path) as rig:
        normal = rig.claim("normal", ("gpu", "w0"), ("gpu", "w1"))
        admin = rig.claim("admin", ("gpu", "w0"), admin=True)
        await rig.prepared(normal, admin)
        await rig.claims.unprepare([admin, normal])
        assert rig.plugin.released == [(WIDGET, ("w0", "w1"))]


async def test_a_failed_prepare_never_releases_a_device_another_claim_holds(
    tmp_path: Path, cdi_dir: Path
) -> None:
    plugin = Recorder()
    async with rig_of(tmp_path, plugin) as rig:
        normal = rig.claim("normal", ("gpu", "w0"))
        await rig.prepared(normal)
        plugin.answers["w1"] = "not an allocation"
        admin = rig.claim("admin", ("a", "w0"), ("b", "w1"), admin=True)  # w0 allocated, then w1 fails
        assert isinstance((await rig.claims.prepare([admin]))[admin[1]], str)
        assert plugin.released == []  # w0 stays with the normal claim, unscrubbed


# -- what the backend answers ---------------------------------------------------------------


async def test_an_allocate_answer_breaking_the_contract_fails_its_claim_naming_the_rule(
    tmp_path: Path, cdi_dir: Path
) -> None:
    """Issue 24: a dict answer was an AttributeError for the whole batch, naming no rule."""
    plugin = Recorder()
    plugin.answers["w1"] = {"envs": {"A": "1"}}
    async with rig_of(tmp_path, plugin) as rig:
        good = rig.claim("good", ("gpu", "w0"))
        bad = rig.claim("bad", ("gpu", "w1"))
        later = rig.claim("later", ("gpu", "w2"))
        answers = await rig.claims.prepare([good, bad, later])
        error = answers[bad[1]]
        assert isinstance(error, str)
        assert "devicehost_allocate" in error
        assert "returned dict, expected ContainerAllocation" in error
        assert isinstance(answers[good[1]], PreparedClaim)
        assert isinstance(answers[later[1]], PreparedClaim)
        assert set(rig.claims.checkpoint.claims) == {good[1], later[1]}


async def test_an_allocate_hook_that_raises_fails_its_claim_only(tmp_path: Path, cdi_dir: Path) -> None:
    plugin = Recorder()
    plugin.answers["w1"] = RuntimeError("w1 is broken")
    async with rig_of(tmp_path, plugin) as rig:
        bad, good = rig.claim("bad", ("gpu", "w1")), rig.claim("good", ("gpu", "w0"))
        answers = await rig.claims.prepare([bad, good])
        assert "raised RuntimeError: w1 is broken" in str(answers[bad[1]])
        assert isinstance(answers[good[1]], PreparedClaim)


# -- CDI and the checkpoint -----------------------------------------------------------------


async def test_a_subrequest_is_prepared_under_a_valid_cdi_name(tmp_path: Path, cdi_dir: Path) -> None:
    async with rig_of(tmp_path) as rig:
        ref = rig.claim("c", ("gpu/older", "w0"))
        (claim,) = await rig.prepared(ref)
        kind = f"{DRIVER}/claim-{ref[1]}"
        ((device),) = claim.devices
        assert device.request == "gpu/older"
        assert device.cdi_ids == (f"{kind}=gpu_older.widget",)
        assert rules.cdi_name_problem(device.cdi_ids[0]) is None
        spec = json.loads(cdi.spec_path(kind).read_text())
        assert spec["kind"] == kind
        assert [d["name"] for d in spec["devices"]] == ["gpu_older.widget"]
        assert {"IDS=w0"} <= set(spec["devices"][0]["containerEdits"]["env"])
        saved = Checkpoint(rig.claims.checkpoint.path)
        assert saved.load() is None
        assert saved.claims[ref[1]].devices[0].request == "gpu/older"


async def test_unprepare_releases_removes_the_spec_and_forgets_the_claim(
    tmp_path: Path, cdi_dir: Path
) -> None:
    async with rig_of(tmp_path) as rig:
        ref = rig.claim("c", ("gpu", "w0"), ("gpu", "w1"))
        await rig.prepared(ref)
        kind = f"{DRIVER}/claim-{ref[1]}"
        assert cdi.spec_path(kind).exists()
        assert rig.claims.checkpoint.held() == {(WIDGET, "w0"), (WIDGET, "w1")}
        assert await rig.claims.unprepare([ref]) == {ref[1]: ""}
        assert rig.plugin.released == [(WIDGET, ("w0", "w1"))]
        assert not cdi.spec_path(kind).exists()
        assert rig.claims.checkpoint.held() == set()
        assert await rig.claims.unprepare([ref]) == {ref[1]: ""}  # asked again: nothing more to undo
        assert rig.plugin.released == [(WIDGET, ("w0", "w1"))]


async def test_a_claim_prepared_twice_answers_the_same_without_a_second_allocate(
    tmp_path: Path, cdi_dir: Path
) -> None:
    async with rig_of(tmp_path) as rig:
        ref = rig.claim("c", ("gpu", "w0"))
        (first,) = await rig.prepared(ref)
        reads = rig.cluster.calls["claim"]
        (second,) = await rig.prepared(ref)
        assert second == first
        assert len(rig.plugin.allocated) == 1
        assert rig.cluster.calls["claim"] == reads  # not even read again

        restarted = Claims(  # a host restart: the same checkpoint file, a new Claims
            DRIVER,
            rig.cluster,
            Checkpoint(rig.claims.checkpoint.path),
            {WIDGET: attached(rig.server, POOL)},
        )
        assert restarted.checkpoint.load() is None
        assert (await restarted.prepare([ref]))[ref[1]] == first
        assert len(rig.plugin.allocated) == 1


# -- claims refused -------------------------------------------------------------------------


async def test_each_bad_claim_is_refused_alone_with_a_one_line_reason(tmp_path: Path, cdi_dir: Path) -> None:
    devices = [Device("w0"), Device("w1"), Device("w2", Health.UNHEALTHY), Device("w3")]
    async with rig_of(tmp_path, devices=devices, holds={WIDGET: frozenset({"w3"})}) as rig:
        refused = {
            rig.claim(
                "other-driver", ("gpu", "w0"), driver="other.org"
            ): "has no devices of driver example.com",
            rig.claim(
                "unknown-pool", ("gpu", "w0"), pool="node-b/widget"
            ): "pool 'node-b/widget' is not served",
            rig.claim("unknown-device", ("gpu", "w9")): "device 'w9' is not in pool 'node-a/widget'",
            rig.claim("unhealthy", ("gpu", "w2")): "device 'w2' of pool 'node-a/widget' is unhealthy",
            rig.claim("device-plugin", ("gpu", "w3")): "'w3' is held through the device plugin API",
            ("default", "uid-missing", "missing"): "reading ResourceClaim default/missing",
            ("default", "uid-stale", "c-good"): "has UID uid-c-good, not uid-stale",
        }
        good = rig.claim("c-good", ("gpu", "w0"), ("gpu", "w1"))
        mixed = rig.claim("mixed", ("gpu", "w1"), ("gpu", "w9"))  # one good, one unknown device
        answers = await rig.claims.prepare([*refused, good, mixed])
        for ref, reason in refused.items():
            error = answers[ref[1]]
            assert isinstance(error, str), ref
            assert reason in error, (ref, error)
            assert "\n" not in error
        assert "device 'w9'" in str(answers[mixed[1]])
        assert isinstance(answers[good[1]], PreparedClaim)
        assert [ids for _, ids, _ in rig.plugin.allocated] == [("w0", "w1")]  # only the good claim's
        assert set(rig.claims.checkpoint.claims) == {good[1]}


async def test_a_claim_whose_later_request_fails_gives_back_what_it_allocated(
    tmp_path: Path, cdi_dir: Path
) -> None:
    plugin = Recorder()
    plugin.answers["w1"] = 42
    async with rig_of(tmp_path, plugin) as rig:
        ref = rig.claim("c", ("a", "w0"), ("b", "w1"))
        error = (await rig.claims.prepare([ref]))[ref[1]]
        assert "returned int" in str(error)
        assert plugin.released == [(WIDGET, ("w0",))]
        assert rig.claims.checkpoint.claims == {}
        assert rig.advertised_unhealthy() == set()
        assert list(cdi_dir.glob("*.json")) == []


async def test_ten_thousand_claims_in_one_call_are_read_a_few_at_a_time_and_each_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig_of(tmp_path) as rig:
        reading = most = 0
        real = rig.cluster.claim

        async def claim(namespace: str, name: str) -> ClaimAllocation:
            nonlocal reading, most
            reading += 1
            most = max(most, reading)
            try:
                await asyncio.sleep(0)
                return await real(namespace, name)
            finally:
                reading -= 1

        monkeypatch.setattr(rig.cluster, "claim", claim)
        good = rig.claim("good", ("r", "w0"))
        refs = [("default", f"uid-gone-{n}", f"gone-{n}") for n in range(10_000)]
        answers = await rig.claims.prepare([*refs, good])
    assert most <= claims_module.READS
    assert isinstance(answers[good[1]], PreparedClaim)
    gone = [answers[uid] for _, uid, _ in refs]
    assert all(isinstance(a, str) and "gone-" in a and "404" in a for a in gone)


async def test_an_api_server_that_does_not_answer_fails_the_claim_not_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims_module, "READ_TIMEOUT", 0.05)
    async with rig_of(tmp_path) as rig:
        good = rig.claim("good", ("r", "w0"))
        stuck = rig.claim("stuck", ("r", "w1"))
        real = rig.cluster.claim

        async def claim(namespace: str, name: str) -> ClaimAllocation:
            if name == "stuck":
                await asyncio.sleep(3600)
            return await real(namespace, name)

        monkeypatch.setattr(rig.cluster, "claim", claim)
        answers = await rig.claims.prepare([stuck, good])
    assert isinstance(answers[good[1]], PreparedClaim)
    assert answers[stuck[1]] == "reading ResourceClaim default/stuck: no answer within 0.05 s"


async def test_an_unhealthy_device_is_prepared_only_where_it_is_published_tainted(tmp_path: Path) -> None:
    """Withdrawn, a sick device reached a claim only through a stale view: refused. Published with
    a taint, the scheduler gave it only to a claim that tolerates the taint: prepared."""
    async with rig_of(tmp_path, devices=widgets(2, w1=Health.UNHEALTHY)) as rig:
        ref = rig.claim("sick", ("gpu", "w1"))
        assert "is unhealthy" in str((await rig.claims.prepare([ref]))[ref[1]])
        rig.claims.tainted = True
        (prepared,) = await rig.prepared(ref)
        assert [d.device_id for d in prepared.devices] == ["w1"]


# -- shares: devices that allow multiple allocations (consumable capacity) --------------------

BANDWIDTH = Capacity("100G", default="1G", min="100M", max="100G", step="1M")
NIC = Device(
    "w0", capacity={"bw": BANDWIDTH, "vfs": Capacity(8, valid_values=(1,))}, allow_multiple_allocations=True
)


def shared_claim(rig: Rig, name: str, share: str, amount: str, request: str = "nic") -> tuple[str, str, str]:
    """A claim holding a share of w0, as the scheduler allocates it."""
    uid = f"uid-{name}"
    device = AllocatedDevice(request, DRIVER, POOL, "w0", share_id=share, consumed={"bw": amount, "vfs": "1"})
    rig.cluster.claims[("default", name)] = ClaimAllocation(uid, (device,))
    return "default", uid, name


async def test_each_share_reaches_the_hook_with_its_id_and_amounts(tmp_path: Path) -> None:
    async with rig_of(tmp_path, devices=[NIC, Device("w1")]) as rig:
        first, second = shared_claim(rig, "a", "share-a", "10G"), shared_claim(rig, "b", "share-b", "5G")
        await rig.prepared(first, second)
        shares = [claim.shares if claim else None for _, _, claim in rig.plugin.allocated]
        assert shares == [
            {"w0": Share("share-a", {"bw": "10G", "vfs": "1"})},
            {"w0": Share("share-b", {"bw": "5G", "vfs": "1"})},
        ]
        kept = [d for c in rig.claims.checkpoint.claims.values() for d in c.devices]
        assert [(d.device_id, d.share, dict(d.consumed)) for d in kept] == [
            ("w0", "share-a", {"bw": "10G", "vfs": "1"}),
            ("w0", "share-b", {"bw": "5G", "vfs": "1"}),
        ]
        assert rig.advertised_unhealthy() == {"w0"}  # the device plugin side never hands out a shared one


async def test_a_share_is_released_with_its_claim_and_the_device_stays_held_for_the_other(
    tmp_path: Path,
) -> None:
    async with rig_of(tmp_path, devices=[NIC, Device("w1")]) as rig:
        first, second = shared_claim(rig, "a", "share-a", "10G"), shared_claim(rig, "b", "share-b", "5G")
        await rig.prepared(first, second)
        assert await rig.claims.unprepare([first]) == {first[1]: ""}
        assert rig.plugin.released == [(WIDGET, ("w0",))]
        assert rig.plugin.released_shares == [{"w0": "share-a"}]
        assert rig.advertised_unhealthy() == {"w0"}  # share-b still holds it
        assert await rig.claims.unprepare([second]) == {second[1]: ""}
        assert rig.plugin.released_shares == [{"w0": "share-a"}, {"w0": "share-b"}]
        assert rig.advertised_unhealthy() == set()


async def test_whole_devices_are_released_without_a_claim_as_before(tmp_path: Path) -> None:
    async with rig_of(tmp_path, devices=[NIC, Device("w1")]) as rig:
        ref = rig.claim("whole", ("gpu", "w1"))
        await rig.prepared(ref)
        await rig.claims.unprepare([ref])
        assert (rig.plugin.released, rig.plugin.released_shares) == ([(WIDGET, ("w1",))], [])


async def test_the_same_device_twice_in_one_request_is_refused(tmp_path: Path) -> None:
    async with rig_of(tmp_path, devices=[NIC]) as rig:
        twice = tuple(
            AllocatedDevice("nic", DRIVER, POOL, "w0", share_id=s, consumed={"bw": "1G"}) for s in ("x", "y")
        )
        rig.cluster.claims[("default", "twice")] = ClaimAllocation("uid-twice", twice)
        answer = (await rig.claims.prepare([("default", "uid-twice", "twice")]))["uid-twice"]
        assert answer == "device 'w0' is allocated twice to request 'nic'"
        assert rig.plugin.allocated == []


async def test_shares_survive_a_restart_in_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "driver" / "claims.json"
    plugin = Recorder()
    with fake_server(plugin, [NIC]) as server:
        claims = Claims(DRIVER, _Claims(), Checkpoint(path), {WIDGET: attached(server, POOL)})
        device = AllocatedDevice("nic", DRIVER, POOL, "w0", share_id="s1", consumed={"bw": "2G"})
        claims._cluster.claims[("default", "c")] = ClaimAllocation("uid-c", (device,))  # type: ignore[attr-defined]
        answer = (await claims.prepare([("default", "uid-c", "c")]))["uid-c"]
        assert isinstance(answer, PreparedClaim)
        again = Checkpoint(path)
        assert again.load() is None
        (kept,) = again.claims["uid-c"].devices
        assert (kept.share, dict(kept.consumed)) == ("s1", {"bw": "2G"})
        restarted = Claims(DRIVER, _Claims(), again, {WIDGET: attached(server, POOL)})
        assert await restarted.unprepare([("default", "uid-c", "c")]) == {"uid-c": ""}
    assert plugin.released_shares == [{"w0": "s1"}]


class _Claims:
    """An API server with claims only (for the restart test)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimAllocation] = {}

    async def claim(self, namespace: str, name: str) -> ClaimAllocation:
        return self.claims[(namespace, name)]


def test_a_claim_reads_share_ids_and_consumed_capacity() -> None:
    claim = {
        "metadata": {"uid": "u"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "nic",
                            "driver": DRIVER,
                            "pool": POOL,
                            "device": "w0",
                            "shareID": "abc",
                            "consumedCapacity": {"bw": "10G"},
                        },
                        {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "w1"},
                    ]
                }
            }
        },
    }
    shared, whole = claim_allocation(claim).devices
    assert (shared.share_id, dict(shared.consumed)) == ("abc", {"bw": "10G"})
    assert (whole.share_id, dict(whole.consumed)) == ("", {})


def test_a_shared_device_is_published_with_its_request_policies() -> None:
    entry = device_entry(NIC)
    assert entry["allowMultipleAllocations"] is True
    assert entry["capacity"] == {
        "bw": {
            "value": "100G",
            "requestPolicy": {"default": "1G", "validRange": {"min": "100M", "max": "100G", "step": "1M"}},
        },
        "vfs": {"value": "8", "requestPolicy": {"validValues": ["1"]}},
    }
    assert "allowMultipleAllocations" not in device_entry(Device("w1", capacity={"bw": Capacity("1G")}))
    assert device_entry(Device("w1", capacity={"bw": Capacity("1G")}))["capacity"] == {"bw": {"value": "1G"}}


@pytest.mark.parametrize(
    ("device", "problem"),
    [
        (
            Device("d", capacity={"bw": BANDWIDTH}),
            "device 'd': capacity bw: a request policy needs allow_multiple_allocations=True",
        ),
        (
            Device(
                "d",
                capacity={"bw": Capacity("1G", min="1M", valid_values=("1M",))},
                allow_multiple_allocations=True,
            ),
            "device 'd': capacity bw: a request policy has a range (min) or valid_values, not both",
        ),
        (
            Device("d", capacity={"bw": Capacity("1G", step="1M")}, allow_multiple_allocations=True),
            "device 'd': capacity bw: step and max need min",
        ),
        (
            Device("d", capacity={"bw": Capacity("lots")}, allow_multiple_allocations=True),
            "device 'd': capacity bw: 'lots' must be a non-negative int or a quantity",
        ),
        (
            Device("d", allow_multiple_allocations="yes"),  # type: ignore[arg-type]
            "device 'd': allow_multiple_allocations 'yes' must be a bool",
        ),
    ],
)
def test_bad_capacities_are_refused_naming_the_device(device: Device, problem: str) -> None:
    assert (rules.device_problem(device) or "").startswith(problem)
