"""Prometheus metrics (prefix ``devicehost_``), read from the host's state snapshot at scrape time.

Counters live as plain integers on the objects that count them (a resource's registrations, a
servicer's updates and errors, a backend's hook failures) and reach this module only through
:class:`~devicehost.host.state.HostState`; the collector turns one snapshot into metric families
when scraped, so nothing on the hot path touches the metrics library except the allocation
latency histogram.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from devicehost.hookspecs.types import Health
from devicehost.host.state import BackendState, Durations, HostState, ResourceState

T = TypeVar("T")

Sample = tuple[tuple[str, ...], float]
"""Extra label values (after the family's base labels) and the value of one sample."""

_RESOURCE_LABELS = ("resource", "backend")
_BACKEND_LABELS = ("backend",)


@dataclass(frozen=True)
class _Family(Generic[T]):
    """One metric family: how to build it, and the samples one resource or backend adds to it."""

    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]
    name: str
    documentation: str
    extra_labels: tuple[str, ...]
    samples: Callable[[T], Iterable[Sample]]

    def empty(self, base_labels: tuple[str, ...]) -> GaugeMetricFamily | CounterMetricFamily:
        return self.kind(self.name, self.documentation, labels=[*base_labels, *self.extra_labels])


def _by_key(counts: Iterable[tuple[str, int]]) -> list[Sample]:
    return [((key,), count) for key, count in counts]


_RESOURCE_FAMILIES: tuple[_Family[ResourceState], ...] = (
    _Family(
        GaugeMetricFamily,
        "devicehost_devices",
        "Devices advertised, by health",
        ("health",),
        lambda r: [((h.value,), r.devices.get(h.value, 0)) for h in Health],
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_resource_registered",
        "1 when registered with the kubelet and streaming",
        (),
        lambda r: [((), 1 if r.registered else 0)],
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_listandwatch_streams",
        "Open ListAndWatch streams",
        (),
        lambda r: [((), r.streams)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_listandwatch_updates",
        "Device lists sent on ListAndWatch streams",
        (),
        lambda r: [((), r.updates_sent)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_registrations",
        "Registrations with the kubelet, by reason",
        ("reason",),
        lambda r: _by_key(r.registrations.items()),
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_registration_failed_tries",
        "Registration tries that failed and were retried with backoff",
        (),
        lambda r: [((), r.failed_tries)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_allocations",
        "Allocate calls answered",
        (),
        lambda r: [((), r.allocations)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_errors",
        "Calls from the kubelet answered with an error, by gRPC code",
        ("code",),
        lambda r: _by_key(r.errors.items()),
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_device_holder",
        "1 per device the kubelet assigns to a container (pod-resources API)",
        ("device", "namespace", "pod", "container"),
        lambda r: [((d, h.namespace, h.pod, h.container), 1) for d, h in sorted(r.holders.items())],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_device_releases",
        "Device sets handed to the backend's release hook",
        (),
        lambda r: [((), r.releases)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_dra_slices_restored",
        "ResourceSlices of the resource's pool written back after something else deleted or changed them",
        (),
        lambda r: [((), r.dra.slices_restored)] if r.dra is not None else [],
    ),
)

_BACKEND_FAMILIES: tuple[_Family[BackendState], ...] = (
    _Family(
        GaugeMetricFamily,
        "devicehost_backend_loaded",
        "1 when the backend loaded and serves",
        (),
        lambda b: [((), 1 if b.loaded else 0)],
    ),
    _Family(
        CounterMetricFamily,
        "devicehost_hook_failures",
        "Hook calls that raised, hung or answered wrongly",
        ("hook",),
        lambda b: _by_key(b.hook_failures.items()),
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_backend_discovery_failing",
        "1 while the backend's last discovery failed (its served resources are kept as they were)",
        (),
        lambda b: [((), 1 if b.discovery_error else 0)] if b.loaded else [],
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_resources_refused",
        "Resources the backend's last discovery offered that the host refused (a rule broken)",
        (),
        lambda b: [((), len(b.refused))] if b.loaded else [],
    ),
    _Family(
        GaugeMetricFamily,
        "devicehost_hooks_stuck",
        "Hook calls running past the hook timeout",
        (),
        lambda b: [((), len(b.stuck_hooks))] if b.loaded else [],
    ),
)


def _families(
    table: tuple[_Family[T], ...], base_labels: tuple[str, ...], items: Iterable[tuple[tuple[str, ...], T]]
) -> Iterator[Metric]:
    """Every family of ``table``, with the samples of each (base label values, item) pair."""
    items = list(items)
    for family in table:
        metric = family.empty(base_labels)
        for labels, item in items:
            for extra, value in family.samples(item):
                metric.add_metric([*labels, *extra], value)
        yield metric


_CLAIM_OPERATIONS = ("prepare", "unprepare")
"""The reference DRA driver's families: ``<operation>_claims_total`` and
``<operation>_claim_duration_seconds``, by ``result`` (``success``, ``error``); here by driver too."""


def _histogram(durations: Durations) -> tuple[list[tuple[str, float]], float]:
    return [
        ("+Inf" if bound == math.inf else repr(bound), count) for bound, count in durations.buckets
    ], durations.total


def _dra_families(state: HostState | None) -> Iterator[Metric]:
    """The DRA drivers' families: one sample set per driver, however many resources it serves."""
    drivers = {r.dra.driver: r.dra.calls for r in (state.resources if state else ()) if r.dra and r.dra.calls}
    for operation in _CLAIM_OPERATIONS:
        calls = CounterMetricFamily(f"devicehost_{operation}_claims", f"Claims {operation}d through DRA, by driver and result", labels=["driver", "result"])  # fmt: skip
        seconds = HistogramMetricFamily(f"devicehost_{operation}_claim_duration_seconds", f"Time of the kubelet's call that {operation}d each claim, by driver and result", labels=["driver", "result"])  # fmt: skip
        for driver, stats in sorted(drivers.items()):
            for (op, result), durations in stats.claims.items():
                if op == operation:
                    calls.add_metric([driver, result], durations.count)
                    buckets, total = _histogram(durations)
                    seconds.add_metric([driver, result], buckets, total)
        yield from (calls, seconds)
    writes = CounterMetricFamily("devicehost_dra_slice_writes", "ResourceSlices created, replaced or deleted, by driver", labels=["driver"])  # fmt: skip
    publish = HistogramMetricFamily("devicehost_dra_publish_duration_seconds", "Time to bring a driver's ResourceSlices in step after a change", labels=["driver"])  # fmt: skip
    health = CounterMetricFamily("devicehost_dra_health_transitions", "Devices of a driver that turned Healthy or Unhealthy", labels=["driver", "health"])  # fmt: skip
    for driver, stats in sorted(drivers.items()):
        writes.add_metric([driver], stats.slice_writes)
        publish.add_metric([driver], *_histogram(stats.publish))
        for to in (h.value for h in Health):
            health.add_metric([driver, to], stats.health_transitions.get(to, 0))
    yield from (writes, publish, health)


RELOADS_HELP = "Reloads of the configuration, by outcome (refused: in whole or in part)"
RELOAD_REFUSED_HELP = "1 when the latest reload was refused in whole or in part (see /status)"


class _StateCollector(Collector):
    """Turns one snapshot per scrape into the state's metric families."""

    def __init__(self, snapshot: Callable[[], HostState]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        """The families without samples, so registering does not take a snapshot."""
        yield from (family.empty(_RESOURCE_LABELS) for family in _RESOURCE_FAMILIES)
        yield from (family.empty(_BACKEND_LABELS) for family in _BACKEND_FAMILIES)
        yield GaugeMetricFamily("devicehost_ready", "1 when the host is ready (as /readyz)")
        yield GaugeMetricFamily("devicehost_live", "1 when the host is live (as /healthz)")
        yield CounterMetricFamily("devicehost_reloads", RELOADS_HELP, labels=["outcome"])
        yield GaugeMetricFamily("devicehost_reload_refused", RELOAD_REFUSED_HELP)
        yield from _dra_families(None)

    def collect(self) -> Iterator[Metric]:
        state = self._snapshot()
        resources = (((r.name, r.backend), r) for r in state.resources)
        yield from _families(_RESOURCE_FAMILIES, _RESOURCE_LABELS, resources)
        # Loaded backends first, then the ones that failed, each in the snapshot's order.
        backends = sorted(state.backends, key=lambda b: not b.loaded)
        yield from _families(_BACKEND_FAMILIES, _BACKEND_LABELS, (((b.name,), b) for b in backends))
        yield GaugeMetricFamily(
            "devicehost_ready", "1 when the host is ready (as /readyz)", 1 if state.ready else 0
        )
        yield GaugeMetricFamily(
            "devicehost_live", "1 when the host is live (as /healthz)", 1 if state.live else 0
        )
        reloads = CounterMetricFamily("devicehost_reloads", RELOADS_HELP, labels=["outcome"])
        reloads.add_metric(["applied"], state.reloads.applied)
        reloads.add_metric(["refused"], state.reloads.refused)
        yield reloads
        yield GaugeMetricFamily(
            "devicehost_reload_refused", RELOAD_REFUSED_HELP, 1 if state.reloads.latest_refused else 0
        )
        yield from _dra_families(state)


class HostMetrics:
    """The registry of one host: the state collector and the allocation latency histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.allocation_seconds = Histogram(
            "devicehost_allocation_duration_seconds",
            "Time to answer an Allocate call, by resource",
            ["resource"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 10),
        )

    def watch(self, snapshot: Callable[[], HostState]) -> None:
        """Report the state ``snapshot()`` returns on every scrape (it is not called before one)."""
        self.registry.register(_StateCollector(snapshot))

    def observer(self, resource: str) -> Callable[[float], None]:
        """Where ``resource``'s Allocate latencies (in seconds) go."""
        return self.allocation_seconds.labels(resource).observe

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)
