"""The hostdev backend's hooks, called directly against fake /dev and /sys trees in tmp_path."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy
import pytest
import yaml

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, Mount
from devicehost.hookspecs import rules, spec
from devicehost_hostdev import HostdevBackend
from devicehost_hostdev.ids import device_id, replica_ids

README = Path(__file__).parents[1] / "README.md"


def touch(root: Path, *host_paths: str) -> None:
    for host_path in host_paths:
        path = root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def remove(root: Path, host_path: str) -> None:
    (root / host_path.lstrip("/")).unlink()


def plug_usb(root: Path, name: str, vendor: str, product: str, bus: int, dev: int, serial: str = "") -> None:
    """A USB device as sysfs shows it, and its device node."""
    sysfs = root / "sys/bus/usb/devices" / name
    sysfs.mkdir(parents=True)
    files = {"idVendor": vendor, "idProduct": product, "busnum": str(bus), "devnum": str(dev)}
    if serial:
        files["serial"] = serial
    for file, text in files.items():
        (sysfs / file).write_text(f"{text}\n")
    touch(root, f"/dev/bus/usb/{bus:03d}/{dev:03d}")


def backend_for(root: Path, *resources: dict[str, Any]) -> HostdevBackend:
    backend = HostdevBackend()
    backend.devicehost_configure({"root": str(root), "resources": list(resources)})
    return backend


def one_group(name: str, **group: Any) -> dict[str, Any]:
    return {"name": name, "groups": [group]}


def discovered(backend: HostdevBackend) -> dict[str, tuple[Device, ...]]:
    return {resource.name: resource.devices for resource in backend.devicehost_discover()}


def ids(backend: HostdevBackend, resource: str) -> list[str]:
    return [device.id for device in discovered(backend)[resource]]


# --- settings -----------------------------------------------------------------------------

SERIAL = "devices.example.com/serial"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "dev/ttyUSB*"}])]},
            f"resources[0] ({SERIAL}).groups[0].paths[0].path: must be absolute",
        ),
        (
            {"resources": [one_group(SERIAL)]},
            f"resources[0] ({SERIAL}).groups[0]: needs at least one entry in paths or usb",
        ),
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "/dev/fuse"}], count=0)]},
            f"resources[0] ({SERIAL}).groups[0].count: must be at least 1",
        ),
        (
            {"resources": [one_group("serial", paths=[{"path": "/dev/fuse"}])]},
            "resources[0] (serial).name: resource name 'serial' must contain exactly one '/' (domain/name)",
        ),
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "/dev/fuse", "permissions": "rx"}])]},
            f"resources[0] ({SERIAL}).groups[0].paths[0].permissions: must be one or more of r, w and m, "
            "such as rw",
        ),
        (
            {"resources": [one_group(SERIAL, usb=[{"vendor": 403, "product": "6001"}])]},
            f"resources[0] ({SERIAL}).groups[0].usb[0].vendor: must be a quoted string of 4 hex digits, "
            'such as "0403"',
        ),
        (
            {"resources": [{"name": SERIAL, "groups": []}]},
            f"resources[0] ({SERIAL}).groups: needs at least one group",
        ),
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "/dev/a*", "optional": True}])]},
            f"resources[0] ({SERIAL}).groups[0].paths[0].optional: must be false: the first entry decides "
            "a per_match group's devices",
        ),
        (
            {
                "resources": [
                    one_group(SERIAL, paths=[{"path": "/dev/a"}, {"path": "/dev/b*", "container_path": "/b"}])
                ]
            },
            f"resources[0] ({SERIAL}).groups[0].paths[1].container_path: needs a plain path, "
            "or the first path of a per_match group",
        ),
        (
            {
                "resources": [
                    one_group(SERIAL, paths=[{"path": "/run/x", "type": "mount", "permissions": "r"}])
                ]
            },
            f"resources[0] ({SERIAL}).groups[0].paths[0].permissions: only for type device",
        ),
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "/dev/x", "read_only": True}])]},
            f"resources[0] ({SERIAL}).groups[0].paths[0].read_only: only for type mount",
        ),
        (
            {"resources": [one_group(SERIAL, paths=[{"path": "/dev/x", "mode": "rw"}])]},
            f"resources[0] ({SERIAL}).groups[0].paths[0].mode: Extra inputs are not permitted",
        ),
        ({"root": "fake"}, "root: must be absolute"),
        (
            {
                "resources": [
                    one_group(SERIAL, paths=[{"path": "/a"}]),
                    one_group(SERIAL, paths=[{"path": "/b"}]),
                ]
            },
            f"resources[1] ({SERIAL}).name: duplicate of resources[0]",
        ),
    ],
)
def test_invalid_settings_name_the_resource_and_field(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        HostdevBackend().devicehost_configure(settings)


def test_every_problem_is_reported_one_per_line() -> None:
    settings = {"root": "fake", "resources": [one_group(SERIAL, paths=[{"path": "x"}], count=0)]}
    with pytest.raises(ValueError, match="root") as raised:
        HostdevBackend().devicehost_configure(settings)
    assert str(raised.value).splitlines() == [
        "root: must be absolute",
        f"resources[0] ({SERIAL}).groups[0].paths[0].path: must be absolute",
        f"resources[0] ({SERIAL}).groups[0].count: must be at least 1",
    ]


def test_bad_reload_keeps_the_previous_settings(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/fuse")
    backend = backend_for(tmp_path, one_group("example.com/fuse", paths=[{"path": "/dev/fuse"}]))
    with pytest.raises(ValueError, match="count"):
        backend.devicehost_configure({"resources": [one_group("example.com/fuse", paths=[], count=0)]})
    assert ids(backend, "example.com/fuse") == ["fuse"]


def test_no_settings_offer_nothing() -> None:
    backend = HostdevBackend()
    backend.devicehost_configure({})
    assert backend.devicehost_discover() == []


def test_readme_example_is_valid_and_served_from_a_fake_tree(tmp_path: Path) -> None:
    example = re.search(r"```yaml\n(.*?)```", README.read_text(), re.DOTALL)
    assert example is not None
    settings = yaml.safe_load(example.group(1))["backends"]["hostdev"]
    settings["root"] = str(tmp_path)
    touch(tmp_path, "/dev/ttyUSB0", "/dev/fuse", "/dev/net/tun", "/run/foo", "/dev/snd/pcm0", "/dev/snd/ctl")
    plug_usb(tmp_path, "1-1.2", "0403", "6001", bus=1, dev=7, serial="A1B2")
    backend = HostdevBackend()
    backend.devicehost_configure(settings)
    counts = {name: len(devices) for name, devices in discovered(backend).items()}
    assert counts == {
        "devices.example.com/serial": 1,
        "devices.example.com/fuse": 10,
        "devices.example.com/tun": 1,
        "devices.example.com/dongle": 1,
        "devices.example.com/sound": 1,
    }


# --- matching -----------------------------------------------------------------------------


def test_each_glob_match_is_its_own_device(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0", "/dev/ttyUSB1", "/dev/ttyS0")
    backend = backend_for(tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*"}]))
    assert discovered(backend)[SERIAL] == (Device("ttyUSB0"), Device("ttyUSB1"))
    assert backend.devicehost_allocate(SERIAL, ("ttyUSB1",)).devices == [
        DeviceSpec(container_path="/dev/ttyUSB1", host_path="/dev/ttyUSB1", permissions="rw")
    ]


def test_other_entries_go_with_every_match_of_the_first(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/accel0", "/dev/accel1", "/dev/accelctl")
    backend = backend_for(
        tmp_path,
        one_group("example.com/accel", paths=[{"path": "/dev/accel[0-9]"}, {"path": "/dev/accelctl"}]),
    )
    assert ids(backend, "example.com/accel") == ["accel0", "accel1"]
    allocation = backend.devicehost_allocate("example.com/accel", ("accel1",))
    assert [spec.host_path for spec in allocation.devices] == ["/dev/accel1", "/dev/accelctl"]


def test_split_none_makes_one_device_of_every_match(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/snd/pcm0", "/dev/snd/ctl")
    backend = backend_for(
        tmp_path, one_group("example.com/sound", paths=[{"path": "/dev/snd/*"}], split="none")
    )
    [device] = discovered(backend)["example.com/sound"]
    assert re.fullmatch(r"snd-[0-9a-f]{8}", device.id)
    allocation = backend.devicehost_allocate("example.com/sound", (device.id,))
    assert [spec.host_path for spec in allocation.devices] == ["/dev/snd/ctl", "/dev/snd/pcm0"]


def test_optional_paths_may_be_missing(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/net/tun")
    tun = one_group(
        "example.com/tun", paths=[{"path": "/dev/net/tun"}, {"path": "/dev/vhost-net", "optional": True}]
    )
    backend = backend_for(tmp_path, tun)
    assert discovered(backend)["example.com/tun"] == (Device("net_tun", Health.HEALTHY),)
    assert [s.host_path for s in backend.devicehost_allocate("example.com/tun", ("net_tun",)).devices] == [
        "/dev/net/tun"
    ]
    touch(tmp_path, "/dev/vhost-net")
    assert [s.host_path for s in backend.devicehost_allocate("example.com/tun", ("net_tun",)).devices] == [
        "/dev/net/tun",
        "/dev/vhost-net",
    ]


def test_a_missing_required_path_makes_the_device_unhealthy_and_unallocatable(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/net/tun")
    backend = backend_for(
        tmp_path, one_group("example.com/tun", paths=[{"path": "/dev/net/tun"}, {"path": "/dev/vhost-net"}])
    )
    assert discovered(backend)["example.com/tun"] == (Device("net_tun", Health.UNHEALTHY),)
    with pytest.raises(ValueError, match=r"^example\.com/tun: device net_tun is missing /dev/vhost-net$"):
        backend.devicehost_allocate("example.com/tun", ("net_tun",))


def test_count_shares_one_device_between_containers(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/fuse")
    backend = backend_for(tmp_path, one_group("example.com/fuse", paths=[{"path": "/dev/fuse"}], count=3))
    assert ids(backend, "example.com/fuse") == ["fuse-0", "fuse-1", "fuse-2"]
    for replica in ("fuse-0", "fuse-2"):
        assert backend.devicehost_allocate("example.com/fuse", (replica,)).devices == [
            DeviceSpec(container_path="/dev/fuse", host_path="/dev/fuse", permissions="rw")
        ]
    both = backend.devicehost_allocate("example.com/fuse", ("fuse-0", "fuse-1"))
    assert both.devices == [DeviceSpec(container_path="/dev/fuse", host_path="/dev/fuse", permissions="rw")]


def test_usb_devices_match_by_vendor_and_product(tmp_path: Path) -> None:
    plug_usb(tmp_path, "1-1", "0403", "6001", bus=1, dev=2)
    plug_usb(tmp_path, "1-2", "0403", "6015", bus=1, dev=3)
    plug_usb(tmp_path, "2-1.4", "0403", "6001", bus=2, dev=11)
    (tmp_path / "sys/bus/usb/devices/1-1:1.0").mkdir()  # an interface: no idVendor
    backend = backend_for(
        tmp_path, one_group("example.com/ftdi", usb=[{"vendor": "0403", "product": "6001"}])
    )
    assert ids(backend, "example.com/ftdi") == ["usb_1-1", "usb_2-1.4"]
    assert backend.devicehost_allocate("example.com/ftdi", ("usb_2-1.4",)).devices == [
        DeviceSpec(container_path="/dev/bus/usb/002/011", host_path="/dev/bus/usb/002/011", permissions="rw")
    ]


def test_usb_serial_and_case_of_hex_ids(tmp_path: Path) -> None:
    plug_usb(tmp_path, "1-1", "10C4", "ea60", bus=1, dev=2, serial="A1B2")
    plug_usb(tmp_path, "1-2", "10c4", "EA60", bus=1, dev=3, serial="ZZZZ")
    plug_usb(tmp_path, "1-3", "10c4", "ea60", bus=1, dev=4)
    usb = [{"vendor": "10c4", "product": "EA60", "serial": "A1B2", "permissions": "r"}]
    backend = backend_for(tmp_path, one_group("example.com/cp210x", usb=usb))
    assert ids(backend, "example.com/cp210x") == ["usb_1-1"]
    assert backend.devicehost_allocate("example.com/cp210x", ("usb_1-1",)).devices == [
        DeviceSpec(container_path="/dev/bus/usb/001/002", host_path="/dev/bus/usb/001/002", permissions="r")
    ]


def test_usb_device_without_its_node_is_not_matched(tmp_path: Path) -> None:
    plug_usb(tmp_path, "1-1", "0403", "6001", bus=1, dev=2)
    remove(tmp_path, "/dev/bus/usb/001/002")
    backend = backend_for(
        tmp_path, one_group("example.com/ftdi", usb=[{"vendor": "0403", "product": "6001"}])
    )
    assert discovered(backend) == {"example.com/ftdi": ()}


def test_usb_id_survives_a_replug_on_the_same_port(tmp_path: Path) -> None:
    plug_usb(tmp_path, "1-1", "0403", "6001", bus=1, dev=2)
    backend = backend_for(
        tmp_path, one_group("example.com/ftdi", usb=[{"vendor": "0403", "product": "6001"}])
    )
    assert ids(backend, "example.com/ftdi") == ["usb_1-1"]
    (tmp_path / "sys/bus/usb/devices/1-1/devnum").write_text("9\n")
    touch(tmp_path, "/dev/bus/usb/001/009")
    remove(tmp_path, "/dev/bus/usb/001/002")
    assert ids(backend, "example.com/ftdi") == ["usb_1-1"]
    assert backend.devicehost_allocate("example.com/ftdi", ("usb_1-1",)).devices[0].host_path == (
        "/dev/bus/usb/001/009"
    )


# --- hot-plug and health ------------------------------------------------------------------


def test_discover_rescans_devices_appear_and_disappear(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0")
    backend = backend_for(tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*"}]))
    assert ids(backend, SERIAL) == ["ttyUSB0"]
    touch(tmp_path, "/dev/ttyUSB1")
    assert ids(backend, SERIAL) == ["ttyUSB0", "ttyUSB1"]
    remove(tmp_path, "/dev/ttyUSB0")
    remove(tmp_path, "/dev/ttyUSB1")
    assert discovered(backend) == {SERIAL: ()}


def test_health_goes_unhealthy_and_back(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0", "/dev/ttyUSB1")
    backend = backend_for(tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*"}]))
    devices = discovered(backend)[SERIAL]
    healthy = {"ttyUSB0": Health.HEALTHY, "ttyUSB1": Health.HEALTHY}
    assert backend.devicehost_health(SERIAL, devices) == healthy
    remove(tmp_path, "/dev/ttyUSB1")
    assert backend.devicehost_health(SERIAL, devices) == {**healthy, "ttyUSB1": Health.UNHEALTHY}
    touch(tmp_path, "/dev/ttyUSB1")
    assert backend.devicehost_health(SERIAL, devices) == healthy


def test_health_follows_required_but_not_optional_paths(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/net/tun", "/dev/vhost-net")
    paths = [
        {"path": "/dev/net/tun"},
        {"path": "/dev/vhost-net"},
        {"path": "/dev/vhost-vsock", "optional": True},
    ]
    backend = backend_for(tmp_path, one_group("example.com/tun", paths=paths))
    devices = discovered(backend)["example.com/tun"]
    assert backend.devicehost_health("example.com/tun", devices) == {"net_tun": Health.HEALTHY}
    remove(tmp_path, "/dev/vhost-net")
    assert backend.devicehost_health("example.com/tun", devices) == {"net_tun": Health.UNHEALTHY}
    touch(tmp_path, "/dev/vhost-net")
    assert backend.devicehost_health("example.com/tun", devices) == {"net_tun": Health.HEALTHY}


def test_health_of_a_resource_no_longer_configured_is_unhealthy(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/fuse")
    backend = backend_for(tmp_path, one_group("example.com/fuse", paths=[{"path": "/dev/fuse"}]))
    devices = discovered(backend)["example.com/fuse"]
    backend.devicehost_configure({"root": str(tmp_path)})
    assert backend.devicehost_health("example.com/fuse", devices) == {"fuse": Health.UNHEALTHY}


# --- allocation ---------------------------------------------------------------------------


def test_allocate_gives_device_specs_and_mounts_without_the_root(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/net/tun", "/dev/vhost-net", "/run/foo/socket")
    paths = [
        {"path": "/dev/net/tun", "permissions": "rwm"},
        {"path": "/dev/vhost-net", "container_path": "/dev/vhost", "permissions": "r"},
        {"path": "/run/foo", "type": "mount", "read_only": True},
        {"path": "/etc/foo.conf", "type": "mount", "container_path": "/etc/foo.conf", "optional": True},
    ]
    backend = backend_for(tmp_path, one_group("example.com/tun", paths=paths))
    allocation = backend.devicehost_allocate("example.com/tun", ("net_tun",))
    assert allocation == ContainerAllocation(
        devices=[
            DeviceSpec(container_path="/dev/net/tun", host_path="/dev/net/tun", permissions="rwm"),
            DeviceSpec(container_path="/dev/vhost", host_path="/dev/vhost-net", permissions="r"),
        ],
        mounts=[Mount(container_path="/run/foo", host_path="/run/foo", read_only=True)],
    )
    assert rules.allocation_problem(allocation) is None


def test_allocate_refuses_unknown_ids_naming_them(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0")
    backend = backend_for(tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*"}]))
    with pytest.raises(
        ValueError, match=f"^{re.escape(SERIAL)}: no device with ID ttyUSB7, gone is present now$"
    ):
        backend.devicehost_allocate(SERIAL, ("ttyUSB0", "ttyUSB7", "gone"))


def test_allocate_refuses_a_device_unplugged_since_discovery(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0")
    backend = backend_for(tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*"}]))
    assert ids(backend, SERIAL) == ["ttyUSB0"]
    remove(tmp_path, "/dev/ttyUSB0")
    with pytest.raises(ValueError, match="ttyUSB0 is present now"):
        backend.devicehost_allocate(SERIAL, ("ttyUSB0",))


def test_allocate_refuses_two_files_at_one_container_path(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0", "/dev/ttyUSB1")
    backend = backend_for(
        tmp_path, one_group(SERIAL, paths=[{"path": "/dev/ttyUSB*", "container_path": "/dev/ttyS0"}])
    )
    assert backend.devicehost_allocate(SERIAL, ("ttyUSB1",)).devices == [
        DeviceSpec(container_path="/dev/ttyS0", host_path="/dev/ttyUSB1", permissions="rw")
    ]
    with pytest.raises(ValueError, match="/dev/ttyUSB0 and /dev/ttyUSB1 both go to /dev/ttyS0"):
        backend.devicehost_allocate(SERIAL, ("ttyUSB0", "ttyUSB1"))


# --- device IDs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/dev/ttyUSB0", "ttyUSB0"),
        ("/dev/net/tun", "net_tun"),
        ("/dev/vhost-net", "vhost-net"),
        ("/run/foo", "run_foo"),
        ("usb/1-1.2", "usb_1-1.2"),
    ],
)
def test_readable_ids(source: str, expected: str) -> None:
    assert device_id(source) == expected


def test_lossy_or_long_ids_get_a_hash_and_stay_distinct() -> None:
    underscore, slash = device_id("/dev/a_b"), device_id("/dev/a/b")
    assert slash == "a_b"
    assert re.fullmatch(r"a_b-[0-9a-f]{8}", underscore)
    long_paths = [f"/dev/disk/by-path/{'x' * 80}-{n}" for n in range(2)]
    long_ids = [device_id(path) for path in long_paths]
    assert rules.device_ids_problem([underscore, slash, *long_ids]) is None
    assert all(len(i) == rules.MAX_DEVICE_ID_LENGTH for i in long_ids)
    assert long_ids == [device_id(path) for path in long_paths]  # stable


def test_replica_ids_fit_the_limit() -> None:
    replicas = replica_ids(f"/dev/{'y' * 70}", 100)
    assert replicas[0].endswith("-0")
    assert replicas[-1].endswith("-99")
    assert rules.device_ids_problem(replicas) is None


def test_two_groups_matching_one_file_offer_it_once(tmp_path: Path) -> None:
    touch(tmp_path, "/dev/ttyUSB0", "/dev/ttyACM0")
    groups = [{"paths": [{"path": "/dev/tty*"}]}, {"paths": [{"path": "/dev/ttyUSB0", "permissions": "r"}]}]
    backend = backend_for(tmp_path, {"name": SERIAL, "groups": groups})
    assert ids(backend, SERIAL) == ["ttyACM0", "ttyUSB0"]
    assert backend.devicehost_allocate(SERIAL, ("ttyUSB0",)).devices[0].permissions == "rw"


# --- through the host's plumbing ----------------------------------------------------------


def test_entry_point_loads_and_hooks_match_the_spec(tmp_path: Path) -> None:
    """What the host does: load the entry point, instantiate with no arguments, register, call."""
    [entry] = entry_points(group=devicehost.hookspecs.ENTRY_POINT_GROUP, name="hostdev")
    manager = pluggy.PluginManager(devicehost.hookspecs.PROJECT_NAME)
    manager.add_hookspecs(spec)
    backend = entry.load()()
    manager.register(backend)
    manager.check_pending()
    touch(tmp_path, "/dev/fuse")
    settings = {
        "root": str(tmp_path),
        "resources": [one_group("example.com/fuse", paths=[{"path": "/dev/fuse"}])],
    }
    manager.hook.devicehost_configure(settings=settings)
    [resource] = manager.hook.devicehost_discover()
    assert resource.devices == (Device("fuse"),)
    allocation = manager.hook.devicehost_allocate(
        resource="example.com/fuse", device_ids=("fuse",), claim=None
    )
    assert allocation.devices == [
        DeviceSpec(container_path="/dev/fuse", host_path="/dev/fuse", permissions="rw")
    ]


def test_no_start_or_stop_hook_changes_are_found_by_scanning(tmp_path: Path) -> None:
    backend = backend_for(tmp_path, one_group("example.com/fuse", paths=[{"path": "/dev/fuse"}]))
    assert not hasattr(backend, "devicehost_start")
    assert not hasattr(backend, "devicehost_stop")
    assert backend.devicehost_discover()[0].devices == ()
    touch(tmp_path, "/dev/fuse")
    assert [d.id for d in backend.devicehost_discover()[0].devices] == ["fuse"]
