"""devicehost.cdi: spec validation, the file it writes, and where it writes it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicehost import ContainerAllocation, DeviceSpec, Mount, cdi
from devicehost.hookspecs import rules

KIND = "example.com/widget"


def node(name: str) -> cdi.Device:
    return cdi.Device(
        name, cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(path=f"/dev/{name}", host_path="/dev/null")])
    )


def widget_spec(*names: str) -> cdi.Spec:
    return cdi.Spec(
        KIND,
        [node(name) for name in names or ("widget-0",)],
        cdi.ContainerEdits(
            mounts=[cdi.Mount(host_path="/etc", container_path="/etc/example", options=("bind", "ro"))]
        ),
    )


@pytest.fixture
def default_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "default"
    cdi.set_default_dir(directory)
    yield directory
    cdi.set_default_dir(cdi.DEFAULT_CDI_DIR)


def assert_cdi_schema(doc: dict[str, Any]) -> None:
    """The required fields and types of the CDI JSON schema, and no field it does not know."""
    assert set(doc) <= {"cdiVersion", "kind", "devices", "containerEdits"}
    assert isinstance(doc["cdiVersion"], str)
    assert isinstance(doc["kind"], str)
    assert doc["devices"], "a spec needs at least one device"
    edits = [d["containerEdits"] for d in doc["devices"]] + [doc.get("containerEdits", {})]
    for device in doc["devices"]:
        assert set(device) == {"name", "containerEdits"}
    for edit in edits:
        assert set(edit) <= {"env", "deviceNodes", "mounts", "hooks"}
        assert all(isinstance(e, str) and "=" in e for e in edit.get("env", []))
        assert all(isinstance(n["path"], str) for n in edit.get("deviceNodes", []))
        for mount in edit.get("mounts", []):
            assert isinstance(mount["hostPath"], str)
            assert isinstance(mount["containerPath"], str)
            assert all(isinstance(o, str) for o in mount.get("options", []))
        assert all({"hookName", "path"} <= set(h) for h in edit.get("hooks", []))


# --- names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "device", "expected"),
    [
        ("example.com/widget", "widget-0", "example.com/widget=widget-0"),
        ("foo.bar.baz/foo-bar123.B_az", "GPU-0:1", "foo.bar.baz/foo-bar123.B_az=GPU-0:1"),
    ],
)
def test_qualified_names_pass_the_host_rule(kind: str, device: str, expected: str) -> None:
    name = cdi.qualified_name(kind, device)
    assert name == expected
    assert rules.cdi_name_problem(name) is None


@pytest.mark.parametrize(
    ("kind", "device", "message"),
    [
        ("widget", "w0", "must be vendor.com/class"),
        ("example.com/widget/x", "w0", "must be vendor.com/class"),
        ("Example.com/widget", "w0", "must be vendor.com/class"),
        ("example.com/-widget", "w0", "must be vendor.com/class"),
        ("example.com/" + "w" * 64, "w0", "the class at most 63"),
        ("example.com/widget", "w0-", "not fully qualified"),
        ("example.com/widget", "w=0", "not fully qualified"),
        ("example.com/widget", "", "not fully qualified"),
    ],
)
def test_qualified_name_refuses_what_the_runtime_would(kind: str, device: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cdi.qualified_name(kind, device)


# --- validation ---------------------------------------------------------------------------


def test_a_spec_with_devices_shared_edits_and_hooks_is_valid() -> None:
    hook = cdi.Hook("createContainer", "/usr/bin/hook", ("hook", "--x"), {"A": "1"}, timeout=5)
    spec = cdi.Spec(KIND, [node("widget-0")], cdi.ContainerEdits(env={"WIDGETS": "1"}, hooks=[hook]))
    assert cdi.spec_problem(spec) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (cdi.Spec("widget", [node("w0")]), "CDI kind 'widget' must be vendor.com/class"),
        (cdi.Spec(KIND, []), "has no devices; remove it instead"),
        (cdi.Spec(KIND, [node("w0"), node("w0")]), "'w0' appears more than once"),
        (cdi.Spec(KIND, [node("w 0")]), "CDI device name 'w 0' must be letters, digits"),
        (cdi.Spec(KIND, [cdi.Device("w0", cdi.ContainerEdits())]), "'w0' has no container edits"),
        (
            cdi.Spec(KIND, [cdi.Device("w0", cdi.ContainerEdits(env={"A=B": "1"}))]),
            "CDI device 'w0': environment variable name 'A=B'",
        ),
        (
            cdi.Spec(
                KIND, [cdi.Device("w0", cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(path="dev/w0")]))]
            ),
            "CDI device 'w0': path 'dev/w0' must be absolute",
        ),
        (
            cdi.Spec(
                KIND,
                [
                    cdi.Device(
                        "w0", cdi.ContainerEdits(mounts=[cdi.Mount(host_path="etc", container_path="/etc")])
                    )
                ],
            ),
            "path 'etc' must be absolute",
        ),
        (
            cdi.Spec(
                KIND,
                [
                    cdi.Device(
                        "w0",
                        cdi.ContainerEdits(
                            device_nodes=[cdi.DeviceNode(path="/dev/w0", host_path=None, permissions="rx")]
                        ),
                    )
                ],
            ),
            "permissions 'rx' must be made of r, w and m",
        ),
        (
            cdi.Spec(KIND, [node("w0")], cdi.ContainerEdits(hooks=[cdi.Hook("onStart", "/bin/true")])),
            f"CDI spec {KIND!r}: hook '/bin/true': 'onStart' is not one of",
        ),
        (
            cdi.Spec(
                KIND, [node("w0")], cdi.ContainerEdits(hooks=[cdi.Hook("poststop", "/bin/true", timeout=0)])
            ),
            "timeout 0 must be > 0",
        ),
    ],
)
def test_spec_problems_name_the_rule(spec: cdi.Spec, message: str) -> None:
    problem = cdi.spec_problem(spec)
    assert problem is not None
    assert message in problem


def test_an_invalid_spec_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="appears more than once"):
        cdi.write_spec(cdi.Spec(KIND, [node("w0"), node("w0")]), tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- the file -----------------------------------------------------------------------------


def test_written_file_is_the_cdi_json_of_the_spec(tmp_path: Path) -> None:
    hook = cdi.Hook("createContainer", "/usr/bin/hook", ("hook",), {"A": "1"}, timeout=5)
    spec = cdi.Spec(
        KIND,
        [
            node("widget-0"),
            cdi.Device("widget-1", cdi.ContainerEdits(env={"WIDGET": "1"}, hooks=[hook])),
        ],
        cdi.ContainerEdits(
            mounts=[cdi.Mount(host_path="/etc", container_path="/etc/example", options=("bind", "ro"))]
        ),
    )
    path = cdi.write_spec(spec, tmp_path)
    doc = json.loads(path.read_text())
    assert_cdi_schema(doc)
    assert doc == {
        "cdiVersion": "0.6.0",
        "kind": KIND,
        "devices": [
            {
                "name": "widget-0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/widget-0", "hostPath": "/dev/null", "permissions": "rw"}]
                },
            },
            {
                "name": "widget-1",
                "containerEdits": {
                    "env": ["WIDGET=1"],
                    "hooks": [
                        {
                            "hookName": "createContainer",
                            "path": "/usr/bin/hook",
                            "args": ["hook"],
                            "env": ["A=1"],
                            "timeout": 5,
                        }
                    ],
                },
            },
        ],
        "containerEdits": {
            "mounts": [{"hostPath": "/etc", "containerPath": "/etc/example", "options": ["bind", "ro"]}]
        },
    }


def test_file_name_comes_from_the_kind_and_kinds_never_share_one(tmp_path: Path) -> None:
    first = cdi.spec_path("a.com/b-c", tmp_path)
    second = cdi.spec_path("a.com-b/c", tmp_path)
    assert first == tmp_path / "devicehost-a.com_b-c.json"
    assert first != second


def test_mode_is_0644_whatever_the_umask_or_the_old_file(tmp_path: Path) -> None:
    cdi.spec_path(KIND, tmp_path).write_text("{}")
    cdi.spec_path(KIND, tmp_path).chmod(0o600)
    previous = os.umask(0o077)
    try:
        path = cdi.write_spec(widget_spec(), tmp_path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_rewrite_replaces_the_spec_and_leaves_no_temp_file(tmp_path: Path) -> None:
    cdi.write_spec(widget_spec("widget-0"), tmp_path)
    path = cdi.write_spec(widget_spec("widget-0", "widget-1"), tmp_path)
    assert list(tmp_path.iterdir()) == [path]
    assert [d["name"] for d in json.loads(path.read_text())["devices"]] == ["widget-0", "widget-1"]


def test_a_failed_write_keeps_the_old_spec_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cdi.write_spec(widget_spec("widget-0"), tmp_path)
    before = path.read_bytes()

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        cdi.write_spec(widget_spec("widget-0", "widget-1"), tmp_path)
    assert list(tmp_path.iterdir()) == [path]
    assert path.read_bytes() == before


def test_missing_directories_are_created(tmp_path: Path) -> None:
    path = cdi.write_spec(widget_spec(), tmp_path / "run" / "cdi")
    assert path.parent == tmp_path / "run" / "cdi"
    assert path.is_file()


def test_remove_is_idempotent_and_leaves_other_kinds(tmp_path: Path) -> None:
    other = cdi.write_spec(cdi.Spec("example.com/gadget", [node("gadget-0")]), tmp_path)
    cdi.write_spec(widget_spec(), tmp_path)
    for _ in range(2):
        cdi.remove_spec(KIND, tmp_path)
    cdi.remove_spec(KIND, tmp_path / "never-created")
    assert list(tmp_path.iterdir()) == [other]


def test_move_puts_the_same_spec_in_the_new_dir_and_none_in_the_old(tmp_path: Path) -> None:
    written = cdi.write_spec(widget_spec(), tmp_path / "old")
    before = written.read_text()
    assert cdi.move_spec(KIND, tmp_path / "old", tmp_path / "new")
    assert list((tmp_path / "old").iterdir()) == []
    (moved,) = (tmp_path / "new").iterdir()
    assert (moved.name, moved.read_text(), stat.S_IMODE(moved.stat().st_mode)) == (
        written.name,
        before,
        0o644,
    )
    assert not cdi.move_spec(KIND, tmp_path / "old", tmp_path / "new")  # nothing left to move


def test_no_directory_means_the_default_one(default_dir: Path) -> None:
    path = cdi.write_spec(widget_spec())
    assert path.parent == default_dir
    cdi.remove_spec(KIND)
    assert list(default_dir.iterdir()) == []


def test_default_dir_is_where_runtimes_look() -> None:
    assert Path("/var/run/cdi") == cdi.DEFAULT_CDI_DIR


# --- from an allocation -------------------------------------------------------------------


def test_edits_from_allocation_carry_envs_mounts_and_device_nodes() -> None:
    allocation = ContainerAllocation(
        envs={"WIDGETS": "w0"},
        mounts=[
            Mount(container_path="/etc/example", host_path="/etc", read_only=True),
            Mount(container_path="/data", host_path="/srv"),
        ],
        devices=[DeviceSpec(container_path="/dev/w0", host_path="/dev/null", permissions="rw")],
        annotations={"not": "an edit"},
    )
    edits = cdi.edits_from_allocation(allocation)
    assert edits == cdi.ContainerEdits(
        env={"WIDGETS": "w0"},
        device_nodes=[cdi.DeviceNode(path="/dev/w0", host_path="/dev/null", permissions="rw")],
        mounts=[
            cdi.Mount(host_path="/etc", container_path="/etc/example", options=("bind", "ro")),
            cdi.Mount(host_path="/srv", container_path="/data", options=("bind",)),
        ],
    )
    assert cdi.spec_problem(cdi.Spec(KIND, [cdi.Device("w0", edits)])) is None


def test_defined_names_reads_every_spec_as_a_runtime_does(tmp_path: Path) -> None:
    edits = cdi.ContainerEdits(device_nodes=[cdi.DeviceNode(path="/dev/null")])
    written = cdi.write_spec(
        cdi.Spec(kind=KIND, devices=[cdi.Device("w0", edits), cdi.Device("w1", edits)]), tmp_path
    )
    (tmp_path / "other.yaml").write_text("cdiVersion: 0.6.0\nkind: b.com/c\ndevices:\n- name: x\n")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text('{"kind": "z.com/z", "devices": [{"name": "n"}]}')
    assert cdi.defined_names(tmp_path) == {
        f"{KIND}=w0": written,
        f"{KIND}=w1": written,
        "b.com/c=x": tmp_path / "other.yaml",
    }
