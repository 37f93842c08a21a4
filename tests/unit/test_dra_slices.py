"""A resource's devices as a ResourceSlice: typed attributes, built-ins, capacity, healthy only."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import patch

from devicehost import Device, Health, Version
from devicehost.hookspecs.rules import device_problem
from devicehost.host.dra import pci
from devicehost.host.dra.cluster import SLICE_API_VERSION
from devicehost.host.dra.names import device_name
from devicehost.host.dra.slices import device_entry, same_devices, slice_body, slice_spec


def test_each_attribute_is_published_with_its_kind() -> None:
    entry = device_entry(
        Device(
            "w0", attributes={"shared": True, "cores": 8, "model": "w2", "driverVersion": Version("1.2.3")}
        )
    )
    attributes = entry["attributes"]
    assert attributes["shared"] == {"bool": True}
    assert attributes["cores"] == {"int": 8}  # a bool is no int, and an int no string
    assert attributes["model"] == {"string": "w2"}
    assert attributes["driverVersion"] == {"version": "1.2.3"}
    assert json.loads(json.dumps(entry)) == entry  # plain JSON, as the API server takes it


def test_a_version_looking_string_stays_a_string() -> None:
    assert device_entry(Device("w0", attributes={"v": "1.2.3"}))["attributes"]["v"] == {"string": "1.2.3"}


def test_the_built_in_attributes_come_first() -> None:
    entry = device_entry(Device("W_0", numa_nodes=(1,), group="card-0", attributes={"model": "w2"}))
    assert entry["name"] == device_name("W_0") != "W_0"
    assert list(entry["attributes"].items()) == [
        ("id", {"string": "W_0"}),  # the original ID, whatever the DRA name
        ("numaNode", {"int": 1}),
        ("group", {"string": "card-0"}),
        ("model", {"string": "w2"}),
        ("resource.kubernetes.io/numaNode", {"int": 1}),  # the standard name too, last
    ]


def test_numa_node_is_published_only_for_exactly_one_node() -> None:
    assert "numaNode" not in device_entry(Device("w0"))["attributes"]
    assert "numaNode" not in device_entry(Device("w0", numa_nodes=(0, 1)))["attributes"]
    assert device_entry(Device("w0", numa_nodes=(0,)))["attributes"]["numaNode"] == {"int": 0}
    assert "group" not in device_entry(Device("w0"))["attributes"]


def test_the_standard_attributes_follow_what_the_host_knows(tmp_path: Path) -> None:
    standard = "resource.kubernetes.io/"
    assert not [
        n for n in device_entry(Device("w0", numa_nodes=(0, 1)))["attributes"] if n.startswith(standard)
    ]
    (tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0").symlink_to(
        tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    )
    with patch.object(pci, "SYSFS", tmp_path):
        pci.pcie_root.cache_clear()
        try:
            attributes = device_entry(Device("g0", numa_nodes=(1,), pci_bus_id="0000:3b:00.0"))["attributes"]
            elsewhere = device_entry(Device("g1", pci_bus_id="0000:5e:00.0"))["attributes"]  # not in sysfs
        finally:
            pci.pcie_root.cache_clear()
    assert {n: v for n, v in attributes.items() if n.startswith(standard)} == {
        standard + "numaNode": {"int": 1},
        standard + "pciBusID": {"string": "0000:3b:00.0"},
        standard + "pcieRoot": {"string": "pci0000:3a"},
    }
    assert elsewhere[standard + "pciBusID"] == {"string": "0000:5e:00.0"}
    assert standard + "pcieRoot" not in elsewhere


def test_a_pci_address_not_as_sysfs_names_it_is_refused() -> None:
    assert device_problem(Device("g0", pci_bus_id="0000:3b:00.0")) is None
    problem = device_problem(Device("g0", pci_bus_id="3b:00.0"))
    assert (
        problem
        == "device 'g0': pci_bus_id '3b:00.0' must be a PCI address as sysfs names it, such as '0000:3b:00.0'"
    )


def test_capacity_is_published_as_quantities() -> None:
    entry = device_entry(Device("w0", capacity={"memory": "16Gi", "cores": 4}))
    assert entry["capacity"] == {"memory": {"value": "16Gi"}, "cores": {"value": "4"}}
    assert "capacity" not in device_entry(Device("w0"))


def test_unhealthy_devices_are_left_out_of_the_slice() -> None:
    devices = [Device("w0"), Device("w1", Health.UNHEALTHY), Device("w2")]
    spec = slice_spec("node-a", "example.com", "node-a/widget", devices)
    assert [d["name"] for d in spec["devices"]] == ["w0", "w2"]
    assert spec["driver"] == "example.com"
    assert spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a/widget", "resourceSliceCount": 1}


def test_a_slice_is_owned_by_its_node() -> None:
    spec = slice_spec("node-a", "example.com", "node-a/widget", [Device("w0")])
    body = slice_body("s", ("node-a", "uid-n"), spec, resource_version="7")
    assert body["apiVersion"] == SLICE_API_VERSION
    assert body["kind"] == "ResourceSlice"
    assert body["metadata"]["name"] == "s"
    assert body["metadata"]["resourceVersion"] == "7"
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Node",
        "node-a",
        "uid-n",
        True,
    )
    assert "resourceVersion" not in slice_body("s", ("node-a", "uid-n"), spec)["metadata"]


def test_same_devices_ignores_the_pool_generation_only() -> None:
    spec = slice_spec("node-a", "example.com", "node-a/widget", [Device("w0")])
    first = {**spec, "pool": {**spec["pool"], "generation": 1}}
    later = {**spec, "pool": {**spec["pool"], "generation": 5}}
    assert same_devices(first, later)
    assert same_devices(spec, later)  # the wanted spec has no generation yet
    other = slice_spec("node-a", "example.com", "node-a/widget", [Device("w0"), Device("w1")])
    assert not same_devices(first, {**other, "pool": first["pool"]})
    renamed = {**first, "pool": {**first["pool"], "name": "node-a/other"}}
    assert not same_devices(first, renamed)
