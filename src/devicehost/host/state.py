"""The host's state as frozen snapshots: the one shape every reader of the host's state uses.

A leaf module (it imports nothing of the host), so that the operator endpoints, the metrics
and ``devicehost status`` read the host without importing it. ``ready`` and ``live`` are
defined here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ResourceState:
    """One served resource, as its socket, registration and servicer stand."""

    name: str
    backend: str
    socket: str
    """The path of the resource's socket."""
    registered: bool
    """Registered with the current kubelet and streaming to it."""
    streams: int
    """Open ListAndWatch streams."""
    devices: Mapping[str, int]
    """Advertised devices by health value (``Healthy``, ``Unhealthy``)."""
    registrations: Mapping[str, int]
    """Successful registrations, by reason (``start``, ``kubelet restarted``, ...)."""
    updates_sent: int
    """Device lists sent on ListAndWatch streams."""
    allocations: int
    """Allocate calls answered."""
    errors: Mapping[str, int]
    """Calls from the kubelet answered with an error, by gRPC status code name."""

    @property
    def device_count(self) -> int:
        return sum(self.devices.values())

    @property
    def healthy(self) -> int:
        return self.devices.get("Healthy", 0)

    @property
    def registration_count(self) -> int:
        return sum(self.registrations.values())


@dataclass(frozen=True)
class BackendState:
    """One backend the host was asked to run, loaded or not."""

    name: str
    loaded: bool
    reason: str = ""
    """Why it is not loaded (failed to load, or its settings were refused)."""
    stuck_hooks: tuple[str, ...] = ()
    """Hooks running past the hook timeout."""
    hook_failures: Mapping[str, int] = field(default_factory=dict)
    """Hook calls that raised, hung or answered wrongly, by hook name."""


@dataclass(frozen=True)
class KubeletState:
    """``kubelet.sock`` as last seen."""

    socket: str
    present: bool


@dataclass(frozen=True)
class HostState:
    """The whole host at one moment; :attr:`ready` and :attr:`live` are defined only here."""

    kubelet: KubeletState
    backends: tuple[BackendState, ...]
    resources: tuple[ResourceState, ...]
    discoveries: int
    """Discovery rounds run so far."""

    @property
    def waiting(self) -> tuple[str, ...]:
        """Served resources that are not registered and streaming."""
        return tuple(r.name for r in self.resources if not r.registered)

    @property
    def ready(self) -> bool:
        """Discovery has run, and every served resource is registered and streaming."""
        return self.discoveries > 0 and not self.waiting

    @property
    def stuck(self) -> dict[str, tuple[str, ...]]:
        """Hooks running past the hook timeout, by backend (only backends that have some)."""
        return {b.name: b.stuck_hooks for b in self.backends if b.stuck_hooks}

    @property
    def live(self) -> bool:
        """No hook is stuck past the hook timeout."""
        return not self.stuck

    def resource(self, name: str) -> ResourceState:
        """The state of one served resource; ``KeyError`` when it is not served."""
        for state in self.resources:
            if state.name == name:
                return state
        raise KeyError(name)
