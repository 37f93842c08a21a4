"""The example backend's hooks, called directly; CDI specs go to tmp_path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy
import pytest

import devicehost
from devicehost import Device, DeviceSpec, Mount, Resource, cdi
from devicehost.hookspecs import rules, spec
from devicehost.testing.conformance_support import NullNotifier
from devicehost_example import ENV_RESOURCES, ExampleBackend

WIDGET = "example.com/widget"


@pytest.fixture(autouse=True)
def no_env_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RESOURCES, raising=False)


@pytest.fixture
def host_cdi_dir(tmp_path: Path) -> Iterator[Path]:
    """What the host does with its cdi_dir config key."""
    directory = tmp_path / "host-cdi"
    cdi.set_default_dir(directory)
    yield directory
    cdi.set_default_dir(cdi.DEFAULT_CDI_DIR)


def configured(**settings: Any) -> ExampleBackend:
    backend = ExampleBackend()
    backend.devicehost_configure(settings)
    return backend


def test_default_settings_offer_four_widgets_on_numa_node_0() -> None:
    assert configured().devicehost_discover() == [
        Resource(WIDGET, tuple(Device(f"widget-{n}", numa_nodes=(0,)) for n in range(4)))
    ]


def test_numa_nodes_spread_widgets_round_robin() -> None:
    [resource] = configured(resources={WIDGET: 3}, numa_nodes=2).devicehost_discover()
    assert [d.numa_nodes for d in resource.devices] == [(0,), (1,), (0,)]


def test_env_var_sets_resources_unless_the_settings_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_RESOURCES, "example.com/widget=2, example.com/gadget=1")
    from_env = configured().devicehost_discover()
    assert {r.name: [d.id for d in r.devices] for r in from_env} == {
        WIDGET: ["widget-0", "widget-1"],
        "example.com/gadget": ["gadget-0"],
    }
    [from_settings] = configured(resources={WIDGET: 1}).devicehost_discover()
    assert [d.id for d in from_settings.devices] == ["widget-0"]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"resources": {WIDGET: -1}}, "settings.resources"),
        ({"resources": ["example.com/widget"]}, "settings.resources"),
        ({"numa_nodes": 0}, "settings.numa_nodes"),
        ({"cdi": "yes"}, "settings.cdi "),
        ({"cdi": True, "cdi_dir": "run/cdi"}, "settings.cdi_dir"),
    ],
)
def test_bad_settings_name_the_field_and_keep_the_previous_ones(settings: dict[str, Any], field: str) -> None:
    backend = configured(resources={WIDGET: 1})
    before = backend.devicehost_discover()
    with pytest.raises(ValueError, match=field):
        backend.devicehost_configure(settings)
    assert backend.devicehost_discover() == before


def test_allocate_without_cdi_gives_env_mount_and_device_nodes() -> None:
    allocation = configured().devicehost_allocate(WIDGET, ("widget-0", "widget-2"))
    assert rules.allocation_problem(allocation) is None
    assert allocation.envs == {"EXAMPLE_WIDGETS": "widget-0,widget-2"}
    assert list(allocation.mounts) == [Mount("/etc/example", "/etc", read_only=True)]
    assert list(allocation.devices) == [
        DeviceSpec("/dev/widget-0", "/dev/null"),
        DeviceSpec("/dev/widget-2", "/dev/null"),
    ]
    assert list(allocation.cdi_devices) == []


def test_allocate_refuses_unknown_widgets_naming_them() -> None:
    with pytest.raises(ValueError, match=r"example.com/widget has no widgets \['widget-4'\]"):
        configured().devicehost_allocate(WIDGET, ("widget-0", "widget-4"))


def test_cdi_spec_is_written_on_start_and_removed_on_stop(tmp_path: Path) -> None:
    backend = configured(resources={WIDGET: 2, "example.com/gadget": 1}, cdi=True, cdi_dir=str(tmp_path))
    backend.devicehost_start(WIDGET, NullNotifier())
    [path] = tmp_path.iterdir()
    doc = json.loads(path.read_text())
    assert (doc["cdiVersion"], doc["kind"]) == ("0.6.0", WIDGET)
    assert [d["name"] for d in doc["devices"]] == ["widget-0", "widget-1"]
    assert doc["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/widget-1", "hostPath": "/dev/null", "permissions": "rw"}
    ]
    backend.devicehost_stop(WIDGET)
    assert list(tmp_path.iterdir()) == []


def test_allocate_with_cdi_gives_qualified_names_instead_of_mount_and_nodes(tmp_path: Path) -> None:
    backend = configured(cdi=True, cdi_dir=str(tmp_path))
    backend.devicehost_start(WIDGET, NullNotifier())
    allocation = backend.devicehost_allocate(WIDGET, ("widget-0", "widget-3"))
    assert rules.allocation_problem(allocation) is None
    assert list(allocation.cdi_devices) == [f"{WIDGET}=widget-0", f"{WIDGET}=widget-3"]
    assert allocation.envs == {"EXAMPLE_WIDGETS": "widget-0,widget-3"}
    assert (list(allocation.mounts), list(allocation.devices)) == ([], [])


def test_cdi_without_cdi_dir_writes_where_the_host_says(host_cdi_dir: Path) -> None:
    backend = configured(cdi=True)
    backend.devicehost_start(WIDGET, NullNotifier())
    assert list(host_cdi_dir.iterdir()) == [cdi.spec_path(WIDGET, host_cdi_dir)]
    backend.devicehost_stop(WIDGET)
    assert list(host_cdi_dir.iterdir()) == []


def test_stop_removes_the_spec_where_it_was_written_after_a_reload(tmp_path: Path) -> None:
    backend = configured(cdi=True, cdi_dir=str(tmp_path / "old"))
    backend.devicehost_start(WIDGET, NullNotifier())
    backend.devicehost_configure({"cdi": True, "cdi_dir": str(tmp_path / "new")})
    backend.devicehost_stop(WIDGET)
    assert list((tmp_path / "old").iterdir()) == []
    backend.devicehost_stop(WIDGET)  # a second stop finds nothing to remove


def test_a_resource_without_widgets_gets_no_spec_and_plain_answers(tmp_path: Path) -> None:
    backend = configured(resources={WIDGET: 0}, cdi=True, cdi_dir=str(tmp_path))
    backend.devicehost_start(WIDGET, NullNotifier())
    assert list(tmp_path.iterdir()) == []
    assert list(backend.devicehost_allocate(WIDGET, ()).cdi_devices) == []


def test_entry_point_loads_and_hooks_match_the_spec(tmp_path: Path) -> None:
    """What the host does: load the entry point, instantiate with no arguments, register, call."""
    [entry] = entry_points(group=devicehost.hookspecs.ENTRY_POINT_GROUP, name="example")
    manager = pluggy.PluginManager(devicehost.hookspecs.PROJECT_NAME)
    manager.add_hookspecs(spec)
    manager.register(entry.load()())
    manager.check_pending()
    manager.hook.devicehost_configure(settings={"cdi": True, "cdi_dir": str(tmp_path)})
    manager.hook.devicehost_start(resource=WIDGET, notifier=NullNotifier())
    allocation = manager.hook.devicehost_allocate(resource=WIDGET, device_ids=("widget-1",))
    assert list(allocation.cdi_devices) == [f"{WIDGET}=widget-1"]
