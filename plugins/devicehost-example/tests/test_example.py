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


def test_a_bad_resource_name_leaves_the_valid_one_discovered() -> None:
    """A name the host will refuse (it names the rule) must not make discovery raise: the valid
    widget is still offered, and served."""
    backend = configured(resources={"bad name": 2, WIDGET: 2})
    offered = {r.name: [d.id for d in r.devices] for r in backend.devicehost_discover()}
    assert offered == {"bad name": ["bad name-0", "bad name-1"], WIDGET: ["widget-0", "widget-1"]}
    assert rules.resource_name_problem("bad name") is not None
    assert rules.resource_name_problem(WIDGET) is None


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
        ({"resources": {WIDGET: -1}}, r"resources\.\W?example\.com/widget\W?\n.*greater than or equal to 0"),
        ({"resources": ["example.com/widget"]}, r"resources\n.*valid dictionary"),
        ({"numa_nodes": 0}, r"numa_nodes\n.*greater than 0"),
        ({"cdi": "yes"}, r"cdi\n.*valid boolean"),
        ({"cdi": True, "cdi_dir": "run/cdi"}, r"cdi_dir\n.*must be an absolute path"),
        ({"resourcez": {WIDGET: 2}}, r"resourcez\n.*Extra inputs are not permitted"),
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
    assert list(allocation.mounts) == [Mount(container_path="/etc/example", host_path="/etc", read_only=True)]
    assert list(allocation.devices) == [
        DeviceSpec(container_path="/dev/widget-0", host_path="/dev/null"),
        DeviceSpec(container_path="/dev/widget-2", host_path="/dev/null"),
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
    allocation = manager.hook.devicehost_allocate(resource=WIDGET, device_ids=("widget-1",), claim=None)
    assert list(allocation.cdi_devices) == [f"{WIDGET}=widget-1"]


def test_release_scrubs_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    backend = configured()
    with caplog.at_level("INFO", logger="devicehost_example"):
        backend.devicehost_release(WIDGET, ("widget-0", "widget-2"))
    assert backend.scrubbed == [(WIDGET, ("widget-0", "widget-2"))]
    assert "scrubbed example.com/widget widgets widget-0, widget-2" in caplog.text


def test_declares_a_settings_model_the_host_checks_before_configure() -> None:
    """The host validates ``backends.example`` with the model, then hands over the instance."""
    import asyncio

    from devicehost.host.backends.backend import Backend, SettingsRefused
    from devicehost_example import ExampleSettings

    plugin = ExampleBackend()
    backend = Backend("example", plugin, hook_timeout=5)
    assert backend.settings_model is ExampleSettings
    asyncio.run(backend.configure({"resources": {WIDGET: 2}, "numa_nodes": 2}))
    assert [d.numa_nodes for d in plugin.devicehost_discover()[0].devices] == [(0,), (1,)]
    with pytest.raises(SettingsRefused) as refused:
        asyncio.run(backend.configure({"resourcez": {WIDGET: 2}, "numa_nodes": "two"}))
    assert refused.value.problems == (
        "backends.example.numa_nodes: Input should be a valid integer, "
        "unable to parse string as an integer (got 'two')",
        "backends.example.resourcez: unknown key, did you mean 'resources'?",
    )
    assert len(plugin.devicehost_discover()[0].devices) == 2  # refused: the previous settings stay
    backend.close()
