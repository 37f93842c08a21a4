"""The dataclasses backends and the host exchange.

Backends build and return these; they never see protobuf messages. The host converts them to
and from the v1beta1 wire messages.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

_T = TypeVar("_T")


class Health(enum.StrEnum):
    """A device's health as the kubelet understands it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


def keyword_only(cls: type[_T]) -> type[_T]:
    """Let a ``kw_only`` dataclass still take its fields by position, with a DeprecationWarning.

    Positional construction of the path pairs misleads (``devicehost.Mount`` and ``cdi.Mount``
    used to take their two paths in opposite orders); it keeps working for one release.
    """
    init: Callable[..., None] = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: _T, *args: Any, **kwargs: Any) -> None:
        if args:
            if len(args) > len(names):
                raise TypeError(f"{cls.__name__}() takes at most {len(names)} arguments, got {len(args)}")
            spelled = ", ".join(f"{name}=..." for name in names[: len(args)])
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__}: positional arguments are deprecated and will be"
                f" refused in the next release; pass {spelled}",
                DeprecationWarning,
                stacklevel=2,
            )
            for name, value in zip(names, args, strict=False):
                if name in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
                kwargs[name] = value
        init(self, **kwargs)

    setattr(cls, "__init__", __init__)  # noqa: B010  (mypy refuses assigning a method)
    return cls


def health_value_problem(health: object) -> str | None:
    """``None`` for a :class:`Health`; else one phrase quoting the value (the one health check)."""
    if isinstance(health, Health):
        return None
    return f"health {health!r:.100} is not a devicehost.Health"


Api = Literal["device-plugin", "dra", "both"]
"""The kubelet API a resource is served through: extended resources, DRA, or both."""

TaintEffect = Literal["NoSchedule", "NoExecute", "none"]
"""DRA: the effect of an unhealthy device's taint, or ``none``: the device is withdrawn instead."""


@dataclass(frozen=True, kw_only=True)
class HookTimeouts:
    """Seconds a resource's hooks may take, where its hardware needs longer (or less) than the
    host's ``hook_timeout``: ``Resource(..., hook_timeouts=HookTimeouts(allocate=40))``.

    Each is at most what the kubelet allows the call that waits on the hook
    (:data:`devicehost.hookspecs.rules.HOOK_TIMEOUT_LIMITS`); None: the host's ``hook_timeout``.
    A hook past its own bound fails that call alone, as with the host's.

    :param allocate: ``devicehost_allocate`` (a device plugin Allocate, a claim's prepare): at most 45 s.
    :param release: ``devicehost_release`` (a device release, a claim's unprepare): at most 45 s.
    :param health: ``devicehost_health`` (one poll): at most 30 s.
    """

    allocate: float | None = None
    release: float | None = None
    health: float | None = None


class Version(str):
    """DRA only: a device attribute that is a semantic version (``Version("1.0.0")``).

    Published as a ``version`` attribute, so selectors compare it as one
    (``device.attributes["example.com"].driverVersion.isGreaterThan(semver("1.0.0"))``).
    """

    __slots__ = ()


@dataclass(frozen=True)
class Capacity:
    """DRA only: an amount a device has, and how much of it one allocation may take.

    A plain int or quantity string in :attr:`Device.capacity` is an amount with no request policy.
    With a policy, on a device that allows multiple allocations
    (:attr:`Device.allow_multiple_allocations`), each claim takes a share of the amount: what it
    asks for (``capacity.requests`` in the claim), else ``default``, rounded up to ``step`` above
    ``min`` or to the next of ``valid_values``; the scheduler never hands out more than ``value``
    in all.

    :param value: the whole amount (``"100G"``, ``80``).
    :param default: what a claim that asks for nothing takes; None: the whole ``value``.
    :param min: the least one share takes (with ``step``/``max``: a range).
    :param max: the most one share takes.
    :param step: shares are ``min`` plus a multiple of this.
    :param valid_values: the only amounts a share may take (instead of a range), smallest first.
    """

    value: int | str
    default: int | str | None = None
    min: int | str | None = None
    max: int | str | None = None
    step: int | str | None = None
    valid_values: tuple[int | str, ...] = ()

    @property
    def has_policy(self) -> bool:
        """Whether it says how much one allocation takes (else a claim takes it whole)."""
        return self.default is not None or self.min is not None or bool(self.valid_values)


@dataclass(frozen=True)
class Device:
    """One allocatable device of a resource.

    :param id: unique within its resource, at most 63 characters.
    :param health: healthy devices count towards the node's allocatable capacity.
    :param numa_nodes: the NUMA nodes the device is attached to, for topology-aware admission.
    :param group: the physical device this one is a replica or slice of (time-slicing, MIG),
        for allocation policies that spread across physical devices; None: its own.
    :param attributes: DRA only: typed facts about the device that DeviceClass and claim
        selectors match in CEL (``device.attributes["example.com"].model == "w2"``); names are
        C identifiers of at most 32 characters, values a bool, an int, a string of at most
        64 characters or a :class:`Version`. The device plugin API has no place for them.
    :param capacity: DRA only: amounts the device has (``{"memory": "16Gi"}``), an int, a
        Kubernetes quantity string or a :class:`Capacity` with a request policy, matched as
        ``device.capacity["example.com"].memory``.
    :param allow_multiple_allocations: DRA only: many claims may take the device at once, each
        with a share of its :attr:`capacity` (a :class:`Capacity` with a request policy says how
        much a share takes); the allocate hook then gets each share's ID and amounts in
        :attr:`ClaimRequest.shares`, and the release hook is called per share.
    :param consumes: DRA only: what the device takes from its resource's shared counter sets
        while it is allocated, by counter set and counter (``{"gpu-0": {"memory": "20Gi"}}``):
        partitions of one physical device. The scheduler never allocates devices whose
        consumption together exceeds a counter set (see :attr:`Resource.counter_sets`).
    :param binding_conditions: DRA only: condition types (``"Attached"``, at most 4) that must be
        True in the claim's status before a pod that got the device may bind to the node: the
        backend reports them through ``devicehost_device_status`` (a fabric-attached device being
        attached, say). Needs ``binding_failure_conditions`` too.
    :param binding_failure_conditions: DRA only: condition types (at most 4, none of the binding
        conditions) that, once True, make the scheduler give the device up and place the pod anew.
    :param health_message: DRA only: why the device has its health, for people: the kubelet's
        DRA health stream carries it to the pod's ``allocatedResourcesStatus``.
    :param pci_bus_id: DRA only: the device's PCI address (``0000:3b:00.0``, as sysfs names it):
        published as the standard ``resource.kubernetes.io/pciBusID``, with the
        ``resource.kubernetes.io/pcieRoot`` sysfs gives it.
    """

    id: str
    health: Health = Health.HEALTHY
    numa_nodes: tuple[int, ...] = ()
    group: str | None = field(default=None, kw_only=True)
    attributes: Mapping[str, bool | int | str] = field(default_factory=dict, kw_only=True, hash=False)
    capacity: Mapping[str, int | str | Capacity] = field(default_factory=dict, kw_only=True, hash=False)
    allow_multiple_allocations: bool = field(default=False, kw_only=True)
    consumes: Mapping[str, Mapping[str, int | str]] = field(default_factory=dict, kw_only=True, hash=False)
    # -- binding conditions (DRA only) --
    binding_conditions: tuple[str, ...] = field(default=(), kw_only=True)
    binding_failure_conditions: tuple[str, ...] = field(default=(), kw_only=True)
    # -- end binding conditions --
    health_message: str = field(default="", kw_only=True)
    pci_bus_id: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        """Refuse a health that is not a :class:`Health`, quoting it.

        The plain strings ``"Healthy"`` and ``"Unhealthy"`` are still taken for one release,
        with a DeprecationWarning.
        """
        legacy = isinstance(self.health, str) and not isinstance(self.health, Health)
        if legacy and self.health in {h.value for h in Health}:
            warnings.warn(
                f"device {self.id!r}: health {self.health!r} as a plain string is deprecated;"
                f" pass devicehost.Health({self.health!r})",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "health", Health(self.health))
        problem = health_value_problem(self.health)
        if problem:
            raise ValueError(f"device {self.id!r}: {problem} (Health.HEALTHY or Health.UNHEALTHY)")


@dataclass(frozen=True)
class Resource:
    """An extended resource a backend offers, such as ``example.com/widget``.

    :param name: the extended resource name; the kubelet's rules apply
        (see :func:`devicehost.hookspecs.rules.resource_name_problem`).
    :param devices: the devices that make up the resource's capacity.
    :param serve_through: the API the resource is served through unless the operator's
        ``serve_through`` names it or its backend: ``device-plugin``, ``dra`` or ``both``;
        None: ``device-plugin``.
    :param counter_sets: DRA only: shared counters its devices consume from, by counter set
        name and counter (``{"gpu-0": {"memory": "80Gi", "compute": 100}}``): one set per
        physical device whose partitions are published as devices (:attr:`Device.consumes`).
    :param unhealthy_taint: DRA only: the effect of the taint an unhealthy device keeps in its
        ResourceSlice where the API server has device taints: ``NoSchedule`` (new claims stay
        away), ``NoExecute`` (pods using it are evicted too) or ``none`` (withdrawn instead); the
        operator's ``dra_unhealthy_taint`` wins when set; None: ``NoSchedule``.
    :param device_metadata: DRA only: containers of a claim find its devices' metadata (their
        attributes, KEP-5304) under ``/var/run/kubernetes.io/dra-device-attributes/``, which the
        host writes and mounts with the claim's CDI specs.
    :param hook_timeouts: seconds its allocate, release and health hooks may take
        (:class:`HookTimeouts`); unset ones take the host's ``hook_timeout``.
    """

    name: str
    devices: tuple[Device, ...] = ()
    serve_through: Api | None = field(default=None, kw_only=True)
    counter_sets: Mapping[str, Mapping[str, int | str]] = field(
        default_factory=dict, kw_only=True, hash=False
    )
    unhealthy_taint: TaintEffect | None = field(default=None, kw_only=True)
    device_metadata: bool = field(default=False, kw_only=True)
    hook_timeouts: HookTimeouts = field(default_factory=HookTimeouts, kw_only=True)

    def __post_init__(self) -> None:
        """Refuse devices that are not :class:`Device`, naming the first; a list becomes a tuple."""
        if not isinstance(self.devices, (list, tuple)):
            raise TypeError(
                f"resource {self.name!r}: devices must be a tuple of devicehost.Device, got {self.devices!r:.200}"
            )
        for device in self.devices:
            if not isinstance(device, Device):
                raise TypeError(f"resource {self.name!r}: {device!r:.200} is not a devicehost.Device")
        object.__setattr__(self, "devices", tuple(self.devices))


@keyword_only
@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host path bind-mounted into the container: ``Mount(container_path=..., host_path=...)``.

    :param container_path: absolute path inside the container.
    :param host_path: absolute path on the node.
    :param read_only: mount read-only.
    """

    container_path: str
    host_path: str
    read_only: bool = False


@keyword_only
@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """A device node made available in the container: ``DeviceSpec(container_path=..., host_path=...)``.

    :param container_path: absolute path inside the container.
    :param host_path: absolute path of the device node on the node.
    :param permissions: cgroup permissions, any of ``r``, ``w`` and ``m``.
    """

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets for the devices allocated to it.

    :param envs: environment variables to set.
    :param mounts: host paths to mount.
    :param devices: device nodes to expose.
    :param annotations: annotations passed to the container runtime.
    :param cdi_devices: fully qualified CDI device names (``vendor.com/class=name``).
    """

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    devices: Sequence[DeviceSpec] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: Sequence[str] = ()


@dataclass(frozen=True)
class PreferredAllocationRequest:
    """The kubelet's question for one container: which devices would you pick?

    :param available: device IDs the kubelet may choose from.
    :param must_include: device IDs that must be part of the answer.
    :param size: how many device IDs the answer must hold.
    """

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    """What the host tells a backend about the node it serves (``devicehost_host_facts``).

    :param node_name: the Kubernetes node's name (``node_name``, ``--node-name`` or
        ``DEVICEHOST_NODE_NAME``); "" when the operator gave none (nothing is served through DRA then).
    :param cdi_dir: the directory the backend may write its CDI specs in (the host's ``cdi_dir``;
        ``devicehost.cdi.write_spec(spec, facts.cdi_dir)``).
    """

    node_name: str
    cdi_dir: Path


@dataclass(frozen=True)
class Share:
    """DRA only: one allocation of a device that allows multiple allocations.

    :param id: the share's ID, unique among the device's allocations (the scheduler's ``shareID``).
    :param consumed: what the share takes of each of the device's capacities, as quantity strings
        (``{"ingressBandwidth": "10G"}``).
    """

    id: str
    consumed: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ClaimRequest:
    """DRA only: the ResourceClaim request that devices are allocated for, handed to the allocate hook.

    The device plugin API has no claims: there the hook gets ``claim=None``.

    :param name: the request's name in the claim; a subrequest of a prioritized list
        (``firstAvailable``) is ``request/subrequest``, as the scheduler chose it.
    :param claim: ``namespace/name`` of the ResourceClaim.
    :param uid: the ResourceClaim's UID.
    :param config: the opaque configuration for the request and this driver, from the
        DeviceClass then the claim, the last one that names the request (or names none) winning:
        an instance of the backend's claim configuration model when it declares one
        (``devicehost_claim_config_model``), else the parameters as a mapping; None when none applies.
    :param admin_access: the claim asks for admin access: other claims may take the same devices
        (monitor them, do not reset them); the host never releases a device another claim takes.
    :param shares: by device ID, the share of each device that allows multiple allocations
        (:attr:`Device.allow_multiple_allocations`); devices allocated whole are not in it.
    """

    name: str
    claim: str
    uid: str
    config: Any = None
    admin_access: bool = False
    shares: Mapping[str, Share] = field(default_factory=dict, hash=False)


class ResourceNotifier(Protocol):
    """Handed to a backend in ``devicehost_start``: push changes to the host at any time.

    Every method is thread-safe and returns at once; the host applies the change on its own
    loop and pushes it to the kubelet's ListAndWatch stream. Calls after the resource stopped
    are ignored.
    """

    def set_health(self, health: Mapping[str, Health]) -> None:
        """Set the health of the named devices; devices not named keep theirs."""

    def set_devices(self, devices: Sequence[Device]) -> None:
        """Replace the resource's whole device list."""

    def rediscover(self) -> None:
        """Ask the host to run discovery for every backend now (new or removed resources)."""


# -- device status in a claim (DRA only) ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DeviceCondition:
    """DRA only: one condition of an allocated device, as the claim's ``status.devices`` shows it.

    :param status: True or False.
    :param reason: one CamelCase word saying why (``Ready``, ``Attaching``).
    :param message: for people; may be empty.
    """

    status: bool
    reason: str
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class NetworkData:
    """DRA only: how an allocated network device is reached (``status.devices[].networkData``).

    :param interface_name: the interface in the pod (``eth1``); may be empty.
    :param ips: addresses in CIDR notation (``10.9.8.7/24``, ``fd00::1/64``), at most 16.
    :param hardware_address: the MAC address; may be empty.
    """

    interface_name: str = ""
    ips: tuple[str, ...] = ()
    hardware_address: str = ""


@dataclass(frozen=True, kw_only=True)
class DeviceStatus:
    """DRA only: what ``devicehost_device_status`` says of one allocated device.

    :param conditions: by condition type: its binding conditions, its binding failure
        conditions and any others (at most 8 in all).
    :param data: driver-specific facts as JSON (a mapping), at most 10 KiB serialized; None: none.
    :param network: its network data; None: none.
    """

    conditions: Mapping[str, DeviceCondition] = field(default_factory=dict, hash=False)
    data: Mapping[str, Any] | None = field(default=None, hash=False)
    network: NetworkData | None = None
