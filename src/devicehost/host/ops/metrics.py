"""Prometheus metrics (prefix ``devicehost_``), read from the host's state at scrape time.

Counters live as plain integers on the objects that count them (a resource's registrations, a
servicer's updates and errors, a backend's hook failures); the collector turns them into
metric families when scraped, so nothing on the hot path touches the metrics library except
the allocation latency histogram.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devicehost.hookspecs.types import Health

if TYPE_CHECKING:
    from devicehost.host.daemon import Host


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

    def watch(self, host: Host) -> None:
        """Report ``host``'s state on every scrape."""
        self.registry.register(_StateCollector(host))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, host: Host) -> None:
        self._host = host

    def collect(self) -> Iterator[Metric]:
        host = self._host
        rlabels = ["resource", "backend"]
        devices = GaugeMetricFamily(
            "devicehost_devices", "Devices advertised, by health", labels=[*rlabels, "health"]
        )
        registered = GaugeMetricFamily(
            "devicehost_resource_registered",
            "1 when registered with the kubelet and streaming",
            labels=rlabels,
        )
        streams = GaugeMetricFamily(
            "devicehost_listandwatch_streams", "Open ListAndWatch streams", labels=rlabels
        )
        updates = CounterMetricFamily(
            "devicehost_listandwatch_updates", "Device lists sent on ListAndWatch streams", labels=rlabels
        )
        registrations = CounterMetricFamily(
            "devicehost_registrations",
            "Registrations with the kubelet, by reason",
            labels=[*rlabels, "reason"],
        )
        allocations = CounterMetricFamily("devicehost_allocations", "Allocate calls answered", labels=rlabels)
        errors = CounterMetricFamily(
            "devicehost_errors",
            "Calls from the kubelet answered with an error, by gRPC code",
            labels=[*rlabels, "code"],
        )
        for name, server in list(host.resources.items()):
            labels = [name, server.backend.name]
            table = server.table.devices
            for health in Health:
                devices.add_metric([*labels, health.value], sum(d.health is health for d in table))
            registered.add_metric(labels, 1 if server.registered else 0)
            streams.add_metric(labels, server.servicer.open_streams)
            updates.add_metric(labels, server.servicer.updates_sent)
            allocations.add_metric(labels, server.servicer.allocations)
            for reason, count in server.registration_reasons.items():
                registrations.add_metric([*labels, reason], count)
            for code, count in server.servicer.errors.items():
                errors.add_metric([*labels, code], count)
        loaded = GaugeMetricFamily(
            "devicehost_backend_loaded", "1 when the backend loaded and serves", labels=["backend"]
        )
        failures = CounterMetricFamily(
            "devicehost_hook_failures",
            "Hook calls that raised, hung or answered wrongly",
            labels=["backend", "hook"],
        )
        stuck = GaugeMetricFamily(
            "devicehost_hooks_stuck", "Hook calls running past the hook timeout", labels=["backend"]
        )
        for name, backend in list(host.backends.items()):
            loaded.add_metric([name], 1)
            stuck.add_metric([name], len(backend.stuck_hooks()))
            for hook, count in backend.failures.items():
                failures.add_metric([name, hook], count)
        for name in host.failed_backends:
            loaded.add_metric([name], 0)
        yield from (
            devices,
            registered,
            streams,
            updates,
            registrations,
            allocations,
            errors,
            loaded,
            failures,
            stuck,
        )
