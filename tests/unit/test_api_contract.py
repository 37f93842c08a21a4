"""The vendor API: keyword-only path pairs, old positional spellings deprecated, values refused at
construction with the value quoted, everything public in ``__all__``."""

from __future__ import annotations

import pytest

import devicehost
from devicehost import Device, DeviceSpec, Health, Mount, Resource, cdi
from devicehost.testing.conformance_support import DirectBackend, health_toggle


def test_path_pairs_are_keyword_only_and_agree() -> None:
    mount = Mount(container_path="/in", host_path="/out", read_only=True)
    cdi_mount = cdi.Mount(host_path="/out", container_path="/in")
    assert (mount.container_path, mount.host_path) == (cdi_mount.container_path, cdi_mount.host_path)
    spec = DeviceSpec(container_path="/dev/a", host_path="/dev/b")
    node = cdi.DeviceNode(path="/dev/a", host_path="/dev/b")
    assert (spec.container_path, spec.host_path, spec.permissions) == (
        node.path,
        node.host_path,
        node.permissions,
    )


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Mount("/in", "/out", True), Mount(container_path="/in", host_path="/out", read_only=True)),
        (lambda: DeviceSpec("/dev/a", "/dev/b"), DeviceSpec(container_path="/dev/a", host_path="/dev/b")),
        (lambda: cdi.Mount("/out", "/in"), cdi.Mount(host_path="/out", container_path="/in")),
        (
            lambda: cdi.DeviceNode("/dev/a", "/dev/b", "r"),
            cdi.DeviceNode(path="/dev/a", host_path="/dev/b", permissions="r"),
        ),
    ],
)
def test_positional_construction_still_works_with_a_deprecation_warning(
    make: object, expected: object
) -> None:
    with pytest.warns(
        DeprecationWarning, match="positional arguments are deprecated.*pass .*_path="
    ) as caught:
        built = make()  # type: ignore[operator]
    assert built == expected
    assert caught[0].filename == __file__  # the warning points at the caller


def test_positional_construction_refuses_too_many_or_repeated_arguments() -> None:
    with pytest.raises(TypeError, match="at most 3 arguments"):
        Mount("/a", "/b", True, 1)  # type: ignore[call-arg]
    with (
        pytest.raises(TypeError, match="multiple values for argument 'host_path'"),
        pytest.warns(DeprecationWarning, match="positional arguments are deprecated"),
    ):
        Mount("/a", "/b", host_path="/c")  # type: ignore[call-arg]


def test_a_health_that_is_not_a_health_is_refused_with_the_value_quoted() -> None:
    with pytest.raises(ValueError, match=r"device 'w0': health 'ok' is not a devicehost.Health"):
        Device("w0", "ok")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"health True is not"):
        Device("w0", True)  # type: ignore[arg-type]


def test_a_health_spelled_as_a_plain_string_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"health 'Unhealthy' as a plain string is deprecated"):
        device = Device("w0", "Unhealthy")  # type: ignore[arg-type]
    assert device.health is Health.UNHEALTHY


def test_resource_devices_must_be_devices_and_become_a_tuple() -> None:
    with pytest.raises(TypeError, match=r"resource 'a.com/b': 'w0' is not a devicehost.Device"):
        Resource("a.com/b", ("w0",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"devices must be a tuple of devicehost.Device, got 'w0'"):
        Resource("a.com/b", "w0")  # type: ignore[arg-type]
    assert Resource("a.com/b", [Device("w0")]).devices == (Device("w0"),)  # type: ignore[arg-type]


def test_everything_public_is_in_all() -> None:
    for module in (devicehost, cdi, devicehost.policies, devicehost.quantity):
        assert all(hasattr(module, name) for name in module.__all__)
    defined_in_cdi = {
        name
        for name, value in vars(cdi).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == cdi.__name__
    }
    assert defined_in_cdi <= set(cdi.__all__)
    contract = set(devicehost.hookspecs.__all__) - {"ENTRY_POINT_GROUP", "PROJECT_NAME", "REQUIRED_HOOKS"}
    assert contract | {"cdi", "policies", "quantity", "__version__"} == set(devicehost.__all__)


class _Seam:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Health]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return []

    @devicehost.hookimpl
    def devicehost_conformance_set_health(self, resource: str, device_id: str, health: Health) -> None:
        self.calls.append((resource, device_id, health))


class _Legacy:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Health]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return []

    def conformance_set_health(self, resource: str, device_id: str, health: Health) -> None:
        self.calls.append((resource, device_id, health))


def test_the_health_seam_is_a_declared_hook() -> None:
    backend = _Seam()
    toggle = health_toggle(DirectBackend("seam", backend))
    assert toggle is not None
    toggle("a.com/b", "w0", Health.UNHEALTHY)
    assert backend.calls == [("a.com/b", "w0", Health.UNHEALTHY)]


def test_the_old_health_seam_spelling_works_with_a_deprecation_warning() -> None:
    backend = _Legacy()
    with pytest.warns(DeprecationWarning, match="plain conformance_set_health.* is deprecated"):
        toggle = health_toggle(DirectBackend("legacy", backend))
    assert toggle is not None
    toggle("a.com/b", "w0", Health.HEALTHY)
    assert backend.calls == [("a.com/b", "w0", Health.HEALTHY)]
