"""The host's state as frozen snapshots: the one shape every reader of the host's state uses.

A leaf module (it imports nothing of the host), so that the operator endpoints, the metrics
and ``devicehost status`` read the host without importing it. ``ready`` and ``live`` are
defined here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Holder:
    """The container the kubelet assigned a device to (from its pod-resources API)."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True)
class ClusterApi:
    """What the API server serves of DRA, as probed once at start."""

    versions: tuple[str, ...]
    """The ``resource.k8s.io`` versions served, newest first."""
    features: Mapping[str, bool]
    """Each DRA feature the host looks for: whether the cluster has it."""
    taint_rules: str
    """The served version that has DeviceTaintRule ("": none)."""


@dataclass(frozen=True)
class Durations:
    """A histogram as counted so far: cumulative counts per upper bound, their sum and count."""

    buckets: tuple[tuple[float, int], ...]
    """(upper bound in seconds, observations at or under it), the last one ``inf``."""
    total: float
    """The sum of the observed seconds."""

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


@dataclass(frozen=True)
class DraCalls:
    """What a DRA driver did so far: the kubelet's calls, its slice writes, its devices' health."""

    claims: Mapping[tuple[str, str], Durations]
    """Claims prepared or unprepared, by (``prepare`` or ``unprepare``, ``success`` or ``error``):
    how long the kubelet's call that answered each took."""
    slice_writes: int
    """ResourceSlices created, replaced or deleted."""
    publish: Durations
    """Time to bring the published slices in step after a change (one sync that wrote)."""
    health_transitions: Mapping[str, int]
    """Devices that turned ``Healthy`` or ``Unhealthy``, by the health they turned to."""


@dataclass(frozen=True)
class DraState:
    """A resource served through DRA: its driver, and what the kubelet and claims made of it."""

    driver: str
    only: bool
    """Served through DRA only (no device plugin socket)."""
    registered: bool
    """The driver is registered with the kubelet."""
    slice: str
    """The ResourceSlice its devices are published in."""
    prepared_claims: int
    """Claims prepared with its devices, now."""
    slices_restored: int = 0
    """Slices of its pool written back after something else deleted or changed them."""
    cluster: ClusterApi | None = None
    """What the API server serves of DRA (None: not probed yet, or the probe failed)."""
    calls: DraCalls | None = None
    """Its driver's calls, writes and health transitions so far (one driver's, shared by its resources)."""
    restored_claims: int = 0
    """Of the driver's claims its checkpoint had at the start, those restored and still prepared."""
    not_restored: tuple[str, ...] = ()
    """``<claim UID>: <reason>`` of each claim the start could not restore (it was unprepared)."""
    checkpoint_set_aside: tuple[str, ...] = ()
    """Checkpoint files of the driver set aside as unreadable since the start."""


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
    holders: Mapping[str, Holder] = field(default_factory=dict)
    """Device ID to the container the kubelet assigns it to (pod-resources API; assigned only)."""
    releases: int = 0
    """Device sets handed to the backend's release hook."""
    releasing: tuple[str, ...] = ()
    """Devices whose release hook is running (advertised Unhealthy meanwhile)."""
    failed_tries: int = 0
    """Registration tries that failed (refused, or the stream lost soon after), backed off."""
    dra: DraState | None = None
    """How the resource is served through DRA; None: through the device plugin API only."""
    superseded_by: str = ""
    """Another host's socket registered for this resource after ours (then not ``registered``)."""
    hook_timeouts: Mapping[str, float] = field(default_factory=dict)
    """Seconds its allocate, release and health hooks may take (declared, else ``hook_timeout``)."""
    masked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Devices each API (``device-plugin``, ``dra``) must not give out because the other holds
    them or what they share: advertised Unhealthy, or withdrawn from the slices."""

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
    discovery_error: str = ""
    """Why its last discovery failed; empty when it answered (its resources are then its own)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Resources its last discovery offered that the host refused: the problem (the rule), by name."""


@dataclass(frozen=True)
class ReloadRefusal:
    """One reload refused, in whole (``what``: ``configuration``) or for one backend's settings."""

    at: float
    """When, in seconds since the epoch."""
    what: str
    """``configuration`` (the file was refused, the running one stays) or ``backends.<name>``
    (that backend's new settings were refused, it keeps its previous ones)."""
    why: str


@dataclass(frozen=True)
class ReloadState:
    """Reloads so far (SIGHUP, or a changed config file)."""

    applied: int = 0
    """Reloads applied with nothing refused."""
    refused: int = 0
    """Reloads refused in whole or in part."""
    last_refused: ReloadRefusal | None = None
    latest_refused: bool = False
    """The latest reload was refused, in whole or in part (the running config is not the file's)."""


@dataclass(frozen=True)
class KubeletState:
    """``kubelet.sock`` as last seen."""

    socket: str
    present: bool


@dataclass(frozen=True)
class HostState:
    """The whole host at one moment; :attr:`ready` and :attr:`live` are defined only here.

    **live** judges the host alone: its loop runs (and, since a probe answered, the event loop
    is not blocked). No backend, hung or raising, can make it false. **ready** judges
    everything the node relies on: the first discovery is done (every resource it found is
    served, or failed to start), no backend failed, failed its last
    discovery or has a hook stuck, and every served resource is registered and streaming (and
    not superseded by another host); :attr:`problems` says what is not.
    """

    kubelet: KubeletState
    backends: tuple[BackendState, ...]
    resources: tuple[ResourceState, ...]
    discoveries: int
    """Discovery rounds done so far: every backend answered (or failed to) and the resources it
    offered were started or failed to start. Until the first is done, the resources it found
    are not all in :attr:`resources` yet, so the host is not ready."""
    device_release: str = "off"
    """Device release: ``on``, ``off`` (turned off) or why it is paused (socket missing, ...)."""
    loop: str = "running"
    """The host's loop: ``starting`` (not yet running), ``running`` or ``ended``."""
    reloads: ReloadState = ReloadState()
    """Reloads applied and refused; a refused one does not make the host unready (it serves
    the configuration it runs), but ``/status`` and the metrics show it."""

    @property
    def waiting(self) -> tuple[str, ...]:
        """Served resources that are not registered and streaming."""
        return tuple(r.name for r in self.resources if not r.registered)

    @property
    def problems(self) -> tuple[str, ...]:
        """Why the host is not ready, one line each, naming the backend and resource."""
        lines = []
        if self.loop != "running":
            lines.append(f"host: {self.loop}")
        elif self.discoveries == 0:
            lines.append("host: the first discovery is not done (its resources are not all served yet)")
        for backend in self.backends:
            if not backend.loaded:
                lines.append(f"backend {backend.name}: not loaded: {backend.reason}")
                continue
            if backend.discovery_error:
                lines.append(f"backend {backend.name}: discovery failed: {backend.discovery_error}")
            lines += [
                f"backend {backend.name}: resource {name!r} refused: {problem}"
                for name, problem in sorted(backend.refused.items())
            ]
            if backend.stuck_hooks:
                lines.append(
                    f"backend {backend.name}: {', '.join(backend.stuck_hooks)} stuck past the hook timeout"
                )
        lines += [
            f"resource {r.name} (backend {r.backend}): superseded: another host's socket "
            f"{r.superseded_by} registered it later"
            if r.superseded_by
            else f"resource {r.name} (backend {r.backend}): not registered and streaming"
            for r in self.resources
            if not r.registered
        ]
        return tuple(lines)

    @property
    def ready(self) -> bool:
        """The first discovery is done, no backend failed or is stuck, every served resource is
        registered and streaming (through each API it is served by)."""
        return not self.problems

    @property
    def stuck(self) -> dict[str, tuple[str, ...]]:
        """Hooks running past the hook timeout, by backend (only backends that have some)."""
        return {b.name: b.stuck_hooks for b in self.backends if b.stuck_hooks}

    @property
    def live(self) -> bool:
        """The host's loop has not ended; what backends do never changes it."""
        return self.loop != "ended"

    def resource(self, name: str) -> ResourceState:
        """The state of one served resource; ``KeyError`` when it is not served."""
        for state in self.resources:
            if state.name == name:
                return state
        raise KeyError(name)


STARTING = HostState(KubeletState("", False), (), (), 0, loop="starting")
"""What probes read before the host exists: live, not ready."""
