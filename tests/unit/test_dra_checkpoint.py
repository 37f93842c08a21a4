"""The prepared-claims checkpoint: survives a restart, written atomically, unreadable said in one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hostfakes import captured_logs

from devicehost.host.dra import checkpoint as checkpoint_module
from devicehost.host.dra.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    Phase,
    PreparedClaim,
    PreparedDevice,
    set_aside,
)


def device(
    device_id: str, request: str = "gpu", admin: bool = False, cdi: tuple[str, ...] = ()
) -> PreparedDevice:
    return PreparedDevice(request, "n/widget", device_id, "example.com/widget", device_id, cdi, admin)


def claim(uid: str, *devices: PreparedDevice) -> PreparedClaim:
    return PreparedClaim(uid, "default", f"claim-{uid}", devices)


def test_claims_come_back_from_the_file_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "claims.json"  # the directory is made on the first write
    first = Checkpoint(path)
    one = claim("u1", device("w0", "gpu/older", cdi=("example.com/claim-u1=gpu_older.widget",)), device("w1"))
    two = claim("u2", device("w0", admin=True))
    first.add(one)
    first.add(two)
    again = Checkpoint(path)
    assert again.load() is None
    assert again.claims == {"u1": one, "u2": two}
    assert again.claims["u1"].devices[0].cdi_ids == (
        "example.com/claim-u1=gpu_older.widget",
    )  # a tuple again
    assert again.claims["u2"].devices[0].admin_access is True
    first.remove("u1")
    third = Checkpoint(path)
    assert third.load() is None
    assert third.claims == {"u2": two}


def test_the_file_is_replaced_whole_never_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "claims.json"
    kept = Checkpoint(path)
    kept.add(claim("u1", device("w0")))
    before = path.read_text()

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        kept.add(claim("u2", device("w1")))
    assert path.read_text() == before  # a crash mid-write leaves the old file
    assert [p.name for p in tmp_path.iterdir()] == ["claims.json"]  # and no temporary file behind


def test_a_missing_file_is_no_claims(tmp_path: Path) -> None:
    found = Checkpoint(tmp_path / "none.json")
    found.claims = {"stale": claim("stale")}
    assert found.load() is None
    assert found.claims == {}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (json.dumps({"version": 99, "claims": {}}), f"version 99 is not {CHECKPOINT_VERSION}"),
        (json.dumps({"claims": {}}), f"version None is not {CHECKPOINT_VERSION}"),
        ("{not json", "unreadable (JSONDecodeError"),
        (json.dumps({"version": CHECKPOINT_VERSION, "claims": {"u": {"name": "n"}}}), "unreadable (KeyError"),
        (json.dumps({"version": CHECKPOINT_VERSION, "claims": []}), "unreadable (AttributeError"),
        (json.dumps([1]), "unreadable (AttributeError"),
    ],
)
def test_an_unreadable_file_is_one_line_naming_it(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "claims.json"
    path.write_text(content)
    found = Checkpoint(path)
    problem = found.load()
    assert problem is not None
    assert problem.startswith(f"{path}: ")
    assert said in problem
    assert "\n" not in problem
    (aside,) = found.set_aside  # set aside, named in the line: the next start is not stopped by it
    assert f"set aside as {Path(aside).name}" in problem
    assert Path(aside).read_text() == content
    assert not path.exists()


def test_a_directory_in_its_place_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "claims.json").mkdir()
    problem = Checkpoint(tmp_path / "claims.json").load()
    assert problem is not None
    assert "unreadable (IsADirectoryError" in problem
    assert "\n" not in problem


def test_a_file_from_before_admin_access_loads(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    old_device = {
        "request": "gpu",
        "pool": "n/widget",
        "device": "w0",
        "resource": "example.com/widget",
        "device_id": "w0",
        "cdi_ids": ["example.com/claim-u1=gpu.widget"],
    }
    path.write_text(
        json.dumps(
            {"version": 1, "claims": {"u1": {"namespace": "default", "name": "c", "devices": [old_device]}}}
        )
    )
    loaded = Checkpoint(path)
    assert loaded.load() is None
    (only,) = loaded.claims["u1"].devices
    assert only.admin_access is False
    assert only.cdi_ids == ("example.com/claim-u1=gpu.widget",)


def test_held_leaves_out_the_claim_named(tmp_path: Path) -> None:
    found = Checkpoint(tmp_path / "claims.json")
    found.add(claim("normal", device("w0"), device("w1")))
    found.add(claim("admin", device("w0", admin=True)))
    widget = "example.com/widget"
    assert found.held() == {(widget, "w0"), (widget, "w1")}
    assert found.held(but="normal") == {(widget, "w0")}  # the admin claim still holds w0
    assert found.held(but="admin") == {(widget, "w0"), (widget, "w1")}
    found.remove("admin")
    assert found.held(but="normal") == set()


def test_by_resource_groups_in_order() -> None:
    other = PreparedDevice("b", "n/gizmo", "g0", "example.com/gizmo", "g0", ())
    found = claim("u", device("w1"), other, device("w0"))
    assert found.by_resource() == {"example.com/widget": ("w1", "w0"), "example.com/gizmo": ("g0",)}


def test_removing_an_unknown_claim_writes_nothing(tmp_path: Path) -> None:
    found = Checkpoint(tmp_path / "claims.json")
    found.remove("nobody")
    assert not (tmp_path / "claims.json").exists()


async def test_two_instances_own_the_file_one_at_a_time_each_seeing_the_others_claims(
    tmp_path: Path,
) -> None:
    path = tmp_path / "driver" / "claims.json"
    old, new = Checkpoint(path), Checkpoint(path)
    order: list[str] = []
    async with old.owned():
        old.add(claim("u1", device("w0")))
        waiting = asyncio.ensure_future(_own_and_add(new, "u2", order))
        await asyncio.sleep(0.1)
        assert order == []  # the newer waits while the older owns the file
        assert not path.exists()  # written once, when the owner lets go
        order.append("old done")
    await asyncio.wait_for(waiting, 5)
    assert order == ["old done", "new owns"]
    assert sorted(new.claims) == ["u1", "u2"]  # read again under the lock: the older's claim kept
    async with old.owned():
        assert sorted(old.claims) == ["u1", "u2"]
        old.remove("u2")
    again = Checkpoint(path)
    assert again.load() is None
    assert sorted(again.claims) == ["u1"]


async def _own_and_add(checkpoint: Checkpoint, uid: str, order: list[str]) -> None:
    async with checkpoint.owned():
        order.append("new owns")
        checkpoint.add(claim(uid, device("w1")))


async def test_an_unreadable_file_under_the_lock_is_set_aside_and_written_again_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seconds = iter(["20261127T120000", "20261127T120001"])  # set aside a second apart
    monkeypatch.setattr(checkpoint_module.time, "strftime", lambda _: next(seconds))
    path = tmp_path / "claims.json"
    kept = Checkpoint(path)
    kept.add(claim("u1", device("w0")))
    with captured_logs() as logs:
        for _ in range(2):
            path.write_text("{not json")
            async with kept.owned():
                assert sorted(kept.claims) == ["u1"]
    said = [e for e in logs if e["event"].startswith("prepared claims checkpoint unreadable")]
    assert len(said) == 1  # however many seconds apart the two were set aside
    assert str(path) in said[0]["problem"]
    assert len(set(kept.set_aside)) == 2  # the second did not go over the first
    assert [Path(p).read_text() for p in kept.set_aside] == ["{not json", "{not json"]
    again = Checkpoint(path)
    assert again.load() is None
    assert sorted(again.claims) == ["u1"]  # what this host had, written again


def test_each_claim_keeps_its_phase_spec_and_configuration(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    spec = {"cdiVersion": "0.6.0", "kind": "example.com/claim-u1", "devices": []}
    preparing = PreparedClaim(
        "u1", "default", "c1", (device("w0"),), Phase.PREPARING, None, {"gpu": {"a": 1}}
    )
    prepared = PreparedClaim("u2", "default", "c2", (device("w1"),), Phase.PREPARED, spec, {"gpu": None})
    first = Checkpoint(path)
    first.add(preparing)
    first.add(prepared)
    again = Checkpoint(path)
    assert again.load() is None
    assert again.claims == {"u1": preparing, "u2": prepared}
    assert (again.claims["u1"].phase, again.claims["u2"].spec) == (Phase.PREPARING, spec)
    assert again.claims["u1"].configs == {"gpu": {"a": 1}}


async def test_the_file_is_read_again_only_when_another_instance_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "claims.json"
    ours, theirs = Checkpoint(path), Checkpoint(path)
    async with ours.owned():
        ours.add(claim("u1", device("w0")))
    reads: list[Path] = []
    real = Checkpoint.load

    def counted(self: Checkpoint) -> str | None:
        reads.append(self.path)
        return real(self)

    monkeypatch.setattr(Checkpoint, "load", counted)
    async with ours.owned():
        pass
    assert reads == []  # its own last write: not read again
    async with theirs.owned():
        theirs.add(claim("u2", device("w1")))
    async with ours.owned():
        assert sorted(ours.claims) == ["u1", "u2"]
        assert ours.moved == ({("example.com/widget", "w1")}, set())
    assert len(reads) == 2


def test_who_holds_a_device_follows_adds_and_removes(tmp_path: Path) -> None:
    found = Checkpoint(tmp_path / "claims.json")
    found.add(claim("a", device("w0")))
    found.add(claim("b", device("w0", admin=True), device("w1")))
    key = ("example.com/widget", "w0")
    assert found.holds(key)
    assert found.holds(key, but="a")
    assert found.holds(key, but="b")
    found.add(claim("b", device("w1")))  # replaced: w0 no longer among its devices
    assert not found.holds(key, but="a")
    found.remove("a")
    assert not found.holds(key)
    assert found.held() == {("example.com/widget", "w1")}


def test_unreadable_files_set_aside_in_one_second_each_keep_their_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_module.time, "strftime", lambda _: "20261127T120000")
    path = tmp_path / "claims.json"
    names = []
    for n in range(3):
        path.write_text(f"torn {n}")
        aside, said = set_aside(path)
        assert aside is not None
        assert said == f"; set aside as {aside.name}"
        names.append(aside.name)
    stamp = "claims.json.unreadable-20261127T120000"
    assert names == [stamp, f"{stamp}-2", f"{stamp}-3"]
    assert [(tmp_path / n).read_text() for n in names] == ["torn 0", "torn 1", "torn 2"]
