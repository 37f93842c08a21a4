"""The stand-in runtime resolves CDI IDs as containerd 1.7 does: strictly, per spec and per dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devicehost.standin.cdi_runtime import CdiUnresolvable, registry, resolve

EDITS = {"env": ["A=1"]}


def spec(kind: str = "example.com/gpu", **changes: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "0.6.0",
        "kind": kind,
        "devices": [{"name": "g0", "containerEdits": EDITS}],
        **changes,
    }


def write(directory: Path, name: str, content: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(content if isinstance(content, str) else json.dumps(content))


def test_an_id_resolves_to_its_devices_edits_and_every_unresolved_id_is_named(tmp_path: Path) -> None:
    write(tmp_path, "a.json", spec())
    assert resolve(["example.com/gpu=g0"], [tmp_path]) == [EDITS]
    with pytest.raises(CdiUnresolvable, match=r"^unresolvable CDI devices example.com/gpu=g1, x.com/y=z$"):
        resolve(["example.com/gpu=g0", "example.com/gpu=g1", "x.com/y=z"], [tmp_path])


@pytest.mark.parametrize(
    "broken",
    [
        spec(cdiVersion="9.9.9"),
        spec(kind="no-slash"),
        spec(devices=[{"name": "g0", "containerEdits": {}}]),
        spec(devices=[{"name": "g0", "containerEdits": EDITS}, {"name": "g0", "containerEdits": EDITS}]),
        spec(devices=[{"name": "-bad-", "containerEdits": EDITS}]),
        "{not json",
    ],
)
def test_a_spec_the_runtime_refuses_defines_nothing(tmp_path: Path, broken: object) -> None:
    write(tmp_path, "a.json", broken)
    assert registry([tmp_path]) == {}


def test_two_specs_of_one_dir_defining_a_device_leave_it_unresolvable(tmp_path: Path) -> None:
    write(tmp_path, "a.json", spec())
    write(tmp_path, "b.yaml", spec())
    write(tmp_path, "c.txt", spec(kind="example.com/other"))  # not a spec file: not read
    assert registry([tmp_path]) == {}


def test_a_later_dir_wins_over_an_earlier_one(tmp_path: Path) -> None:
    later = {"env": ["B=2"]}
    write(tmp_path / "etc", "a.json", spec())
    write(tmp_path / "run", "a.json", spec(devices=[{"name": "g0", "containerEdits": later}]))
    assert resolve(["example.com/gpu=g0"], [tmp_path / "etc", tmp_path / "run", tmp_path / "none"]) == [later]


def test_a_spec_s_own_edits_come_before_each_device_s(tmp_path: Path) -> None:
    write(tmp_path, "a.json", spec(containerEdits={"env": ["SHARED=1"], "mounts": [{"hostPath": "/a"}]}))
    assert resolve(["example.com/gpu=g0"], [tmp_path]) == [
        {"env": ["SHARED=1", "A=1"], "mounts": [{"hostPath": "/a"}]}
    ]
