"""status.document: the /status JSON of a hand-built HostState."""

from __future__ import annotations

import dataclasses
import json

import pytest

from devicehost.host.ops.status import document
from devicehost.host.state import BackendState, DraState, Holder, HostState, KubeletState, ResourceState

WIDGET = "example.com/widget"
GADGET = "example.com/gadget"
KUBELET_SOCK = "/var/lib/kubelet/device-plugins/kubelet.sock"


def widget(*, registered: bool = True) -> ResourceState:
    return ResourceState(
        name=WIDGET,
        backend="alpha",
        socket="/var/lib/kubelet/device-plugins/widget.sock",
        registered=registered,
        streams=1,
        devices={"Healthy": 3, "Unhealthy": 1},
        registrations={"start": 1, "kubelet restarted": 2},
        updates_sent=6,
        allocations=5,
        errors={"INVALID_ARGUMENT": 1},
        holders={"widget-1": Holder("team-a", "trainer-0", "main")},
        releases=2,
        releasing=("widget-3",),
        hook_timeouts={"allocate": 40.0, "release": 10.0, "health": 10.0},
        masked={"device-plugin": ("widget-2",)},
    )


GADGET_STATE = ResourceState(
    name=GADGET,
    backend="alpha",
    socket="/var/lib/kubelet/device-plugins/gadget.sock",
    registered=True,
    streams=2,
    devices={"Unhealthy": 2},
    registrations={"start": 1},
    updates_sent=1,
    allocations=0,
    errors={},
)

ALPHA = BackendState(
    "alpha", True, stuck_hooks=("devicehost_health",), hook_failures={"devicehost_health": 1}
)
BETA = BackendState("beta", False, reason="import failed: No module named 'beta_sdk'")
GAMMA = BackendState("gamma", True)


def state(
    *,
    resources: tuple[ResourceState, ...] | None = None,
    discoveries: int = 1,
    backends: tuple[BackendState, ...] = (BETA, ALPHA, GAMMA),
) -> HostState:
    return HostState(
        kubelet=KubeletState(KUBELET_SOCK, True),
        backends=backends,
        resources=(widget(), GADGET_STATE) if resources is None else resources,
        discoveries=discoveries,
        device_release="on",
    )


def test_document_has_todays_shape() -> None:
    assert document(state()) == {
        "kubelet": {"socket": KUBELET_SOCK, "present": True},
        "backends": {
            "alpha": {"status": "loaded", "stuck_hooks": ["devicehost_health"]},
            "gamma": {"status": "loaded", "stuck_hooks": []},
            "beta": {"status": "failed", "reason": "import failed: No module named 'beta_sdk'"},
        },
        "resources": {
            GADGET: {
                "backend": "alpha",
                "socket": "/var/lib/kubelet/device-plugins/gadget.sock",
                "registered": True,
                "streams": 2,
                "devices": 2,
                "healthy": 0,
                "registrations": 1,
                "allocations": 0,
                "holders": {},
                "releases": 0,
                "releasing": [],
                "failed_tries": 0,
                "hook_timeouts": {},
                "masked": {},
            },
            WIDGET: {
                "backend": "alpha",
                "socket": "/var/lib/kubelet/device-plugins/widget.sock",
                "registered": True,
                "streams": 1,
                "devices": 4,
                "healthy": 3,
                "registrations": 3,
                "allocations": 5,
                "holders": {"widget-1": "team-a/trainer-0/main"},
                "releases": 2,
                "releasing": ["widget-3"],
                "failed_tries": 0,
                "hook_timeouts": {"allocate": 40.0, "release": 10.0, "health": 10.0},
                "masked": {"device-plugin": ["widget-2"]},
            },
        },
        "device_release": "on",
        "reloads": {"applied": 0, "refused": 0, "latest_refused": False, "last_refused": None},
        "ready": False,
        "live": True,
        "problems": [
            "backend beta: not loaded: import failed: No module named 'beta_sdk'",
            "backend alpha: devicehost_health stuck past the hook timeout",
        ],
    }


def test_masked_devices_are_shown_for_the_apis_the_resource_is_served_through() -> None:
    masked = {"device-plugin": ("widget-2",), "dra": ("widget-3",)}
    only_dp = dataclasses.replace(widget(), masked=masked)
    only_dra = dataclasses.replace(
        widget(), socket="", masked=masked, dra=DraState("example.com", True, True, "node-a-widget", 1)
    )
    assert document(state(resources=(only_dp,)))["resources"][WIDGET]["masked"] == {
        "device-plugin": ["widget-2"]
    }
    assert document(state(resources=(only_dra,)))["resources"][WIDGET]["masked"] == {"dra": ["widget-3"]}


def test_document_lists_loaded_backends_first_and_resources_by_name() -> None:
    doc = document(state())
    assert list(doc["backends"]) == ["alpha", "gamma", "beta"]
    assert list(doc["resources"]) == [GADGET, WIDGET]


def test_document_is_json() -> None:
    doc = document(state())
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize(
    ("host", "ready"),
    [
        pytest.param(state(backends=(GAMMA,)), True, id="all registered"),
        pytest.param(state(), False, id="a backend failed, another is stuck"),
        pytest.param(state(resources=(widget(registered=False), GADGET_STATE)), False, id="one waiting"),
        pytest.param(state(resources=(), discoveries=0), False, id="no discovery yet"),
        pytest.param(
            state(resources=(), discoveries=1, backends=(GAMMA,)), True, id="discovered, nothing to serve"
        ),
    ],
)
def test_ready_is_the_snapshots_own(host: HostState, ready: bool) -> None:
    assert document(host)["ready"] is ready is host.ready


def test_live_is_the_snapshots_own_and_no_backend_changes_it() -> None:
    unstuck = dataclasses.replace(state(), backends=(BETA, GAMMA))
    assert document(unstuck)["live"] is True is unstuck.live
    assert document(state())["live"] is True is state().live  # alpha has a stuck hook
    ended = dataclasses.replace(state(), loop="ended")
    assert document(ended)["live"] is False is ended.live


def test_kubelet_absent() -> None:
    absent = dataclasses.replace(state(), kubelet=KubeletState(KUBELET_SOCK, False))
    assert document(absent)["kubelet"] == {"socket": KUBELET_SOCK, "present": False}
