"""HostMetrics: every metric family, read from a hand-built HostState at scrape time."""

from __future__ import annotations

import dataclasses

import pytest

from devicehost.host.dra.stats import DriverStats, Timings
from devicehost.host.ops.metrics import HostMetrics
from devicehost.host.state import BackendState, DraState, HostState, KubeletState, ResourceState

WIDGET = "example.com/widget"
GADGET = "example.com/gadget"

STATE = HostState(
    kubelet=KubeletState("/var/lib/kubelet/device-plugins/kubelet.sock", True),
    backends=(
        BackendState("beta", False, reason="import failed"),
        BackendState(
            "alpha",
            True,
            stuck_hooks=("devicehost_discover", "devicehost_health"),
            hook_failures={"devicehost_allocate": 2},
        ),
        BackendState("gamma", True),
    ),
    resources=(
        ResourceState(
            name=WIDGET,
            backend="alpha",
            socket="/var/lib/kubelet/device-plugins/widget.sock",
            registered=True,
            streams=2,
            devices={"Healthy": 3, "Unhealthy": 1},
            registrations={"start": 1, "kubelet restarted": 2},
            updates_sent=5,
            allocations=7,
            errors={"INVALID_ARGUMENT": 4},
        ),
        ResourceState(
            name=GADGET,
            backend="gamma",
            socket="/var/lib/kubelet/device-plugins/gadget.sock",
            registered=False,
            streams=0,
            devices={"Unhealthy": 2},
            registrations={},
            updates_sent=0,
            allocations=0,
            errors={},
        ),
    ),
    discoveries=1,
)

W = f'backend="alpha",resource="{WIDGET}"'
G = f'backend="gamma",resource="{GADGET}"'


@pytest.fixture
def metrics() -> HostMetrics:
    metrics = HostMetrics()
    metrics.watch(lambda: STATE)
    return metrics


def lines(metrics: HostMetrics) -> list[str]:
    return metrics.render().decode().splitlines()


def samples(metrics: HostMetrics, family: str) -> list[str]:
    """The sample lines of one family (``family`` or ``family_total``, not ``_created``)."""
    return [
        line
        for line in lines(metrics)
        if line.startswith((family + "{", family + "_total{", family + " ", family + "_total "))
    ]


@pytest.mark.parametrize(
    ("family", "kind", "help_text"),
    [
        ("devicehost_devices", "gauge", "Devices advertised, by health"),
        ("devicehost_resource_registered", "gauge", "1 when registered with the kubelet and streaming"),
        ("devicehost_listandwatch_streams", "gauge", "Open ListAndWatch streams"),
        ("devicehost_listandwatch_updates_total", "counter", "Device lists sent on ListAndWatch streams"),
        ("devicehost_registrations_total", "counter", "Registrations with the kubelet, by reason"),
        ("devicehost_allocations_total", "counter", "Allocate calls answered"),
        (
            "devicehost_errors_total",
            "counter",
            "Calls from the kubelet answered with an error, by gRPC code",
        ),
        ("devicehost_backend_loaded", "gauge", "1 when the backend loaded and serves"),
        ("devicehost_hook_failures_total", "counter", "Hook calls that raised, hung or answered wrongly"),
        ("devicehost_hooks_stuck", "gauge", "Hook calls running past the hook timeout"),
        (
            "devicehost_allocation_duration_seconds",
            "histogram",
            "Time to answer an Allocate call, by resource",
        ),
    ],
)
def test_every_family_is_declared_with_its_help_and_type(
    metrics: HostMetrics, family: str, kind: str, help_text: str
) -> None:
    text = lines(metrics)
    assert f"# HELP {family} {help_text}" in text
    assert f"# TYPE {family} {kind}" in text


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        pytest.param(
            "devicehost_devices",
            [
                f'devicehost_devices{{backend="alpha",health="Healthy",resource="{WIDGET}"}} 3.0',
                f'devicehost_devices{{backend="alpha",health="Unhealthy",resource="{WIDGET}"}} 1.0',
                f'devicehost_devices{{backend="gamma",health="Healthy",resource="{GADGET}"}} 0.0',
                f'devicehost_devices{{backend="gamma",health="Unhealthy",resource="{GADGET}"}} 2.0',
            ],
            id="devices, every health value, 0 when absent",
        ),
        pytest.param(
            "devicehost_resource_registered",
            [f"devicehost_resource_registered{{{W}}} 1.0", f"devicehost_resource_registered{{{G}}} 0.0"],
            id="registered",
        ),
        pytest.param(
            "devicehost_listandwatch_streams",
            [f"devicehost_listandwatch_streams{{{W}}} 2.0", f"devicehost_listandwatch_streams{{{G}}} 0.0"],
            id="streams",
        ),
        pytest.param(
            "devicehost_listandwatch_updates",
            [
                f"devicehost_listandwatch_updates_total{{{W}}} 5.0",
                f"devicehost_listandwatch_updates_total{{{G}}} 0.0",
            ],
            id="updates",
        ),
        pytest.param(
            "devicehost_registrations",
            [
                f'devicehost_registrations_total{{backend="alpha",reason="start",resource="{WIDGET}"}} 1.0',
                f'devicehost_registrations_total{{backend="alpha",reason="kubelet restarted",resource="{WIDGET}"}} 2.0',
            ],
            id="registrations by reason",
        ),
        pytest.param(
            "devicehost_allocations",
            [f"devicehost_allocations_total{{{W}}} 7.0", f"devicehost_allocations_total{{{G}}} 0.0"],
            id="allocations",
        ),
        pytest.param(
            "devicehost_errors",
            [f'devicehost_errors_total{{backend="alpha",code="INVALID_ARGUMENT",resource="{WIDGET}"}} 4.0'],
            id="errors by code",
        ),
        pytest.param(
            "devicehost_backend_loaded",
            [
                'devicehost_backend_loaded{backend="alpha"} 1.0',
                'devicehost_backend_loaded{backend="gamma"} 1.0',
                'devicehost_backend_loaded{backend="beta"} 0.0',
            ],
            id="backend loaded (1) or failed (0)",
        ),
        pytest.param(
            "devicehost_hook_failures",
            ['devicehost_hook_failures_total{backend="alpha",hook="devicehost_allocate"} 2.0'],
            id="hook failures",
        ),
        pytest.param(
            "devicehost_hooks_stuck",
            ['devicehost_hooks_stuck{backend="alpha"} 2.0', 'devicehost_hooks_stuck{backend="gamma"} 0.0'],
            id="stuck hooks, loaded backends only",
        ),
    ],
)
def test_each_family_reports_the_snapshot(metrics: HostMetrics, family: str, expected: list[str]) -> None:
    assert samples(metrics, family) == expected


def test_the_snapshot_is_taken_at_each_scrape_and_not_before() -> None:
    calls: list[int] = []
    current = STATE

    def snapshot() -> HostState:
        calls.append(1)
        return current

    metrics = HostMetrics()
    metrics.watch(snapshot)
    assert calls == []
    assert f"devicehost_resource_registered{{{G}}} 0.0" in lines(metrics)
    assert len(calls) == 1

    current = dataclasses.replace(
        STATE,
        resources=(STATE.resource(WIDGET), dataclasses.replace(STATE.resource(GADGET), registered=True)),
    )
    assert f"devicehost_resource_registered{{{G}}} 1.0" in lines(metrics)
    assert len(calls) == 2


def test_no_resources_and_no_backends_renders_only_the_declarations() -> None:
    metrics = HostMetrics()
    metrics.watch(lambda: HostState(STATE.kubelet, (), (), 0))
    text = lines(metrics)
    assert "# TYPE devicehost_devices gauge" in text
    assert [line for line in text if not line.startswith("#")] == [
        "devicehost_ready 0.0",  # discovery has not run
        "devicehost_live 1.0",
        'devicehost_reloads_total{outcome="applied"} 0.0',
        'devicehost_reloads_total{outcome="refused"} 0.0',
        "devicehost_reload_refused 0.0",
    ]


def test_observer_feeds_the_allocation_histogram(metrics: HostMetrics) -> None:
    observe = metrics.observer(WIDGET)
    observe(0.003)
    observe(0.2)
    text = lines(metrics)
    bucket = "devicehost_allocation_duration_seconds_bucket"
    assert f'{bucket}{{le="0.0025",resource="{WIDGET}"}} 0.0' in text
    assert f'{bucket}{{le="0.005",resource="{WIDGET}"}} 1.0' in text
    assert f'{bucket}{{le="0.1",resource="{WIDGET}"}} 1.0' in text
    assert f'{bucket}{{le="0.5",resource="{WIDGET}"}} 2.0' in text
    assert f'{bucket}{{le="+Inf",resource="{WIDGET}"}} 2.0' in text
    assert f'devicehost_allocation_duration_seconds_count{{resource="{WIDGET}"}} 2.0' in text
    assert not [line for line in text if f'resource="{GADGET}"' in line and "allocation_duration" in line]


def test_observer_keeps_the_buckets_of_today(metrics: HostMetrics) -> None:
    metrics.observer(WIDGET)(1.0)
    bounds = [
        line.split('le="')[1].split('"')[0]
        for line in lines(metrics)
        if line.startswith("devicehost_allocation_duration_seconds_bucket")
    ]
    assert bounds == [
        "0.0005",
        "0.001",
        "0.0025",
        "0.005",
        "0.01",
        "0.025",
        "0.05",
        "0.1",
        "0.5",
        "1.0",
        "5.0",
        "10.0",
        "+Inf",
    ]


def test_dra_drivers_report_the_reference_drivers_families_once_per_driver() -> None:
    stats = DriverStats()
    stats.claims("prepare", [True, True, False], 0.02)
    stats.claims("unprepare", [True], 0.3)
    stats.health([("p", "d0", True)])
    stats.health([("p", "d0", False)])
    publish = Timings()
    publish.observe(0.04)
    calls = stats.snapshot(5, publish)
    dra = DraState("gpu.example.com", True, True, "node-a-gpu", 2, calls=calls)
    resources = tuple(
        dataclasses.replace(STATE.resources[0], name=name, dra=dra)
        for name in ("example.com/a", "example.com/b")
    )  # two resources of one driver: counted once
    metrics = HostMetrics()
    metrics.watch(lambda: dataclasses.replace(STATE, resources=resources))
    d = 'driver="gpu.example.com"'
    assert samples(metrics, "devicehost_prepare_claims") == [
        f'devicehost_prepare_claims_total{{{d},result="error"}} 1.0',
        f'devicehost_prepare_claims_total{{{d},result="success"}} 2.0',
    ]
    text = lines(metrics)
    assert f'devicehost_prepare_claim_duration_seconds_bucket{{{d},le="0.01",result="success"}} 0.0' in text
    assert f'devicehost_prepare_claim_duration_seconds_bucket{{{d},le="0.025",result="success"}} 2.0' in text
    assert f'devicehost_prepare_claim_duration_seconds_bucket{{{d},le="+Inf",result="success"}} 2.0' in text
    assert f'devicehost_unprepare_claim_duration_seconds_sum{{{d},result="success"}} 0.3' in text
    assert f"devicehost_dra_slice_writes_total{{{d}}} 5.0" in text
    assert f'devicehost_dra_publish_duration_seconds_bucket{{{d},le="0.05"}} 1.0' in text
    assert f'devicehost_dra_health_transitions_total{{{d},health="Unhealthy"}} 1.0' in text
    assert f'devicehost_dra_health_transitions_total{{{d},health="Healthy"}} 0.0' in text
    empty = HostMetrics()
    empty.watch(lambda: dataclasses.replace(STATE, resources=()))
    for family, kind in (
        ("devicehost_prepare_claims_total", "counter"),
        ("devicehost_unprepare_claim_duration_seconds", "histogram"),
    ):
        assert f"# TYPE {family} {kind}" in lines(empty)  # declared without any driver
