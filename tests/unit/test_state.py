"""HostState: ready, live, waiting, stuck and resource() are defined once, on the snapshot."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from devicehost.host.state import STARTING, BackendState, HostState, KubeletState, ResourceState

WIDGET = "example.com/widget"
GADGET = "example.com/gadget"


def resource(
    name: str, *, registered: bool = True, devices: Mapping[str, int] | None = None
) -> ResourceState:
    return ResourceState(
        name=name,
        backend="alpha",
        socket=f"/var/lib/kubelet/device-plugins/{name.replace('/', '-')}.sock",
        registered=registered,
        streams=1 if registered else 0,
        devices=devices or {},
        registrations={"start": 1, "kubelet restarted": 2} if registered else {},
        updates_sent=3,
        allocations=4,
        errors={},
    )


def host(
    *resources: ResourceState, discoveries: int = 1, backends: tuple[BackendState, ...] = ()
) -> HostState:
    return HostState(
        kubelet=KubeletState("/var/lib/kubelet/device-plugins/kubelet.sock", True),
        backends=backends or (BackendState("alpha", True),),
        resources=resources,
        discoveries=discoveries,
    )


@pytest.mark.parametrize(
    ("state", "ready", "waiting"),
    [
        pytest.param(host(discoveries=0), False, (), id="no discovery yet"),
        pytest.param(host(resource(WIDGET), discoveries=0), False, (), id="registered, no discovery counted"),
        pytest.param(host(), True, (), id="discovered, nothing to serve"),
        pytest.param(host(resource(WIDGET), resource(GADGET)), True, (), id="all registered"),
        pytest.param(
            host(resource(WIDGET), resource(GADGET, registered=False)), False, (GADGET,), id="one waiting"
        ),
        pytest.param(
            host(resource(WIDGET, registered=False), resource(GADGET, registered=False)),
            False,
            (WIDGET, GADGET),
            id="all waiting, in snapshot order",
        ),
    ],
)
def test_ready_when_discovered_and_every_resource_registered(
    state: HostState, ready: bool, waiting: tuple[str, ...]
) -> None:
    assert state.ready is ready
    assert state.waiting == waiting


@pytest.mark.parametrize(
    ("backends", "stuck"),
    [
        pytest.param((BackendState("alpha", True),), {}, id="nothing stuck"),
        pytest.param((BackendState("alpha", False, reason="import failed"),), {}, id="failed backend"),
        pytest.param(
            (BackendState("alpha", True, stuck_hooks=("devicehost_discover",)), BackendState("beta", True)),
            {"alpha": ("devicehost_discover",)},
            id="one stuck hook",
        ),
        pytest.param(
            (
                BackendState("alpha", True, stuck_hooks=("devicehost_discover", "devicehost_allocate")),
                BackendState("beta", True, stuck_hooks=("devicehost_health",)),
            ),
            {"alpha": ("devicehost_discover", "devicehost_allocate"), "beta": ("devicehost_health",)},
            id="stuck in two backends",
        ),
        pytest.param(
            (BackendState("alpha", True, hook_failures={"devicehost_discover": 3}),),
            {},
            id="failed hooks are not stuck hooks",
        ),
    ],
)
def test_no_backend_can_make_the_host_not_live(
    backends: tuple[BackendState, ...], stuck: dict[str, tuple[str, ...]]
) -> None:
    state = host(resource(WIDGET), backends=backends)
    assert state.live is True
    assert state.stuck == stuck
    assert state.ready is (not stuck and all(b.loaded for b in backends))


def test_a_backend_in_trouble_is_named_in_the_problems() -> None:
    backends = (
        BackendState("alpha", True, stuck_hooks=("devicehost_allocate",)),
        BackendState("beta", False, reason="settings refused: numa_nodes must be positive"),
    )
    state = host(resource(WIDGET, registered=False), backends=backends)
    assert state.problems == (
        "backend alpha: devicehost_allocate stuck past the hook timeout",
        "backend beta: not loaded: settings refused: numa_nodes must be positive",
        f"resource {WIDGET} (backend alpha): not registered and streaming",
    )
    assert (state.ready, state.live) == (False, True)


def test_live_is_the_host_loop_alone() -> None:
    assert (STARTING.live, STARTING.ready, STARTING.problems) == (True, False, ("host: starting",))
    ended = dataclasses.replace(host(resource(WIDGET)), loop="ended")
    assert (ended.live, ended.ready) == (False, False)


def test_resource_finds_a_served_resource_by_name() -> None:
    widget, gadget = resource(WIDGET), resource(GADGET, registered=False)
    state = host(widget, gadget)
    assert state.resource(WIDGET) is widget
    assert state.resource(GADGET) is gadget
    with pytest.raises(KeyError, match=r"example\.com/gizmo"):
        state.resource("example.com/gizmo")


@pytest.mark.parametrize(
    ("devices", "count", "healthy"),
    [
        pytest.param({}, 0, 0, id="no devices"),
        pytest.param({"Healthy": 3}, 3, 3, id="all healthy"),
        pytest.param({"Unhealthy": 2}, 2, 0, id="all unhealthy"),
        pytest.param({"Healthy": 3, "Unhealthy": 2}, 5, 3, id="mixed"),
    ],
)
def test_resource_counts_devices_by_health(devices: dict[str, int], count: int, healthy: int) -> None:
    state = resource(WIDGET, devices=devices)
    assert state.device_count == count
    assert state.healthy == healthy


def test_resource_sums_registrations_over_reasons() -> None:
    assert resource(WIDGET).registration_count == 3
    assert resource(WIDGET, registered=False).registration_count == 0


def test_snapshots_are_frozen() -> None:
    state = host(resource(WIDGET))
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.discoveries = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.resources[0].registered = False  # type: ignore[misc]
