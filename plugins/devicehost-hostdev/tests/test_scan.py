"""The hostdev backend's scan (``scan``) over a fake node tree, and its backend class
(``backend``): what a scan finds is what the tree holds now."""

from __future__ import annotations

from pathlib import Path

from devicehost import Health
from devicehost_hostdev.backend import HostdevBackend
from devicehost_hostdev.config import parse_settings
from devicehost_hostdev.scan import Node, Tree, scan_resource, usb_devices


def touch(root: Path, *host_paths: str) -> None:
    for host_path in host_paths:
        path = root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def plug_usb(root: Path, name: str, vendor: str, product: str, bus: int, dev: int) -> None:
    sysfs = root / "sys/bus/usb/devices" / name
    sysfs.mkdir(parents=True)
    for key, value in {
        "idVendor": vendor,
        "idProduct": product,
        "busnum": str(bus),
        "devnum": str(dev),
    }.items():
        (sysfs / key).write_text(value + "\n")
    touch(root, f"/dev/bus/usb/{bus:03d}/{dev:03d}")


def test_each_match_is_a_device_with_the_groups_shared_nodes_and_missing_entries_named(
    tmp_path: Path,
) -> None:
    touch(tmp_path, "/dev/ttyUSB0", "/dev/ttyUSB1", "/etc/serial.conf")
    group = {
        "paths": [
            {"path": "/dev/ttyUSB*"},
            {"path": "/etc/serial.conf", "type": "mount", "read_only": True},
            {"path": "/dev/serial-lock"},
        ],
    }
    (resource,) = parse_settings({"resources": [{"name": "example.com/serial", "groups": [group]}]}).resources
    found = scan_resource(Tree(str(tmp_path)), resource)
    assert len(found) == 2
    for device, port in zip(found.values(), ("/dev/ttyUSB0", "/dev/ttyUSB1"), strict=True):
        assert device.nodes == (
            Node(port, port),
            Node("/etc/serial.conf", "/etc/serial.conf", mount=True, read_only=True),
        )
        assert device.missing == ("/dev/serial-lock",)


def test_a_usb_entry_matches_by_vendor_and_product_where_its_node_exists(tmp_path: Path) -> None:
    plug_usb(tmp_path, "1-1", "0403", "6001", 1, 4)
    plug_usb(tmp_path, "1-2", "0403", "6015", 1, 5)
    (tmp_path / "sys/bus/usb/devices/1-3").mkdir()  # a hub port: no ids
    settings = parse_settings(
        {
            "resources": [
                {"name": "example.com/ftdi", "groups": [{"usb": [{"vendor": "0403", "product": "6001"}]}]}
            ]
        }
    )
    (entry,) = settings.resources[0].groups[0].usb
    assert usb_devices(Tree(str(tmp_path)), entry) == [("1-1", "/dev/bus/usb/001/004")]


def test_the_backend_reads_the_tree_afresh_at_each_discovery_and_health_check(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/fuse")
    backend = HostdevBackend()
    group = {"paths": [{"path": "/dev/fuse"}], "split": "none", "count": 2}
    backend.devicehost_configure(
        {"root": str(tmp_path), "resources": [{"name": "example.com/fuse", "groups": [group]}]}
    )
    (resource,) = backend.devicehost_discover()
    assert [d.health for d in resource.devices] == [Health.HEALTHY, Health.HEALTHY]
    (tmp_path / "dev/fuse").unlink()
    assert set(backend.devicehost_health(resource.name, resource.devices).values()) == {Health.UNHEALTHY}
