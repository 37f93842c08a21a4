"""What the kubelet accepts: the checks the host runs before anything reaches the wire.

Each function returns ``None`` when the value is fine, or one sentence naming the rule it
breaks. Backends and their tests may call them too.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import get_args

from devicehost import quantity
from devicehost.hookspecs.types import (
    Capacity,
    ContainerAllocation,
    Device,
    DeviceCondition,
    DeviceSpec,
    DeviceStatus,
    HookTimeouts,
    Mount,
    NetworkData,
    Resource,
    TaintEffect,
    Version,
    health_value_problem,
)

MAX_DEVICE_ID_LENGTH = 63
MAX_DOMAIN_LENGTH = 253 - len("requests.")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_CDI_KIND = re.compile(rf"{_DNS1123_SUBDOMAIN.pattern}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
BUILT_IN_ATTRIBUTES = {"id": "ID", "numaNode": "NUMA node", "group": "group"}
"""DRA attributes the host publishes for every device; a backend's attributes may not reuse them."""
_PCI_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_CDI_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.:]*[A-Za-z0-9])?")
SERVE_THROUGH = (None, "device-plugin", "dra", "both")
TAINT_EFFECTS: tuple[str | None, ...] = (None, *get_args(TaintEffect))
"""What ``Resource.unhealthy_taint`` may be."""
MAX_COUNTERS = 32
"""Counters in all of a pool's counter sets (``resource.k8s.io/v1``)."""
_DNS1123_LABEL_RE = re.compile(_DNS1123_LABEL)
_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?"
)


def resource_name_problem(name: str) -> str | None:
    """The kubelet's ``IsExtendedResourceName`` rule, as a reason when ``name`` breaks it."""
    if name.count("/") != 1:
        return f"resource name {name!r} must contain exactly one '/' (domain/name)"
    if "kubernetes.io/" in name:
        return f"resource name {name!r} must not be in the kubernetes.io domain"
    if name.startswith("requests."):
        return f"resource name {name!r} must not start with 'requests.'"
    domain, short = name.split("/")
    if len(domain) > MAX_DOMAIN_LENGTH:
        return (
            f"resource name {name!r}: the domain is {len(domain)} characters, more than {MAX_DOMAIN_LENGTH}"
            " (the kubelet checks it as the quota name 'requests.<domain>', at most 253)"
        )
    if not _DNS1123_SUBDOMAIN.fullmatch(domain):
        return f"resource name {name!r}: {domain!r} is not a DNS-1123 subdomain"
    if len(short) > 63 or not _QUALIFIED_NAME.fullmatch(short):
        return (
            f"resource name {name!r}: {short!r} must be at most 63 characters of "
            "[A-Za-z0-9-_.], starting and ending with a letter or digit"
        )
    return None


def device_ids_problem(ids: Iterable[str]) -> str | None:
    """Device IDs must be non-empty strings of at most 63 characters, unique in a resource."""
    seen: set[str] = set()
    for device_id in ids:
        if not isinstance(device_id, str) or not device_id:
            return f"device ID {device_id!r} must be a non-empty string"
        if len(device_id) > MAX_DEVICE_ID_LENGTH:
            return f"device ID {device_id[:20]!r}... is {len(device_id)} characters, more than 63"
        if device_id in seen:
            return f"device ID {device_id!r} appears more than once"
        seen.add(device_id)
    return None


def cdi_name_problem(name: str) -> str | None:
    """A CDI device name must be fully qualified: ``vendor.com/class=name``."""
    kind, sep, device = name.partition("=")
    if not sep or not _CDI_KIND.fullmatch(kind) or not _CDI_DEVICE_NAME.fullmatch(device):
        return f"CDI device name {name!r} is not fully qualified (vendor.com/class=name)"
    return None


def allocation_problem(allocation: object) -> str | None:
    """Check what ``devicehost_allocate`` returned before it is sent to the kubelet."""
    if not isinstance(allocation, ContainerAllocation):
        return f"returned {type(allocation).__name__}, expected ContainerAllocation"
    return (
        _mappings_problem(allocation)
        or _mounts_problem(allocation.mounts)
        or _device_specs_problem(allocation.devices)
        or _cdi_names_problem(allocation.cdi_devices)
    )


def _mappings_problem(allocation: ContainerAllocation) -> str | None:
    for what, mapping in (("envs", allocation.envs), ("annotations", allocation.annotations)):
        if not isinstance(mapping, Mapping):
            return f"{what} must be a mapping, got {type(mapping).__name__}"
        for key, value in mapping.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                return f"envs and annotations must map non-empty strings to strings, got {key!r}: {value!r}"
    return None


def _mounts_problem(mounts: object) -> str | None:
    if not isinstance(mounts, (list, tuple)) or not all(isinstance(m, Mount) for m in mounts):
        return f"mounts must be a sequence of devicehost.Mount, got {mounts!r:.200}"
    for mount in mounts:
        for path in (mount.container_path, mount.host_path):
            if not isinstance(path, str) or not path.startswith("/"):
                return f"mount path {path!r} must be absolute"
        if not isinstance(mount.read_only, bool):
            return f"mount read_only must be a bool, got {mount.read_only!r}"
    return None


def _device_specs_problem(specs: object) -> str | None:
    if not isinstance(specs, (list, tuple)) or not all(isinstance(d, DeviceSpec) for d in specs):
        return f"devices must be a sequence of devicehost.DeviceSpec, got {specs!r:.200}"
    for spec in specs:
        for path in (spec.container_path, spec.host_path):
            if not isinstance(path, str) or not path.startswith("/"):
                return f"device path {path!r} must be absolute"
        if (
            not isinstance(spec.permissions, str)
            or not spec.permissions
            or set(spec.permissions) - set("rwm")
        ):
            return f"device permissions {spec.permissions!r} must be made of r, w and m"
    return None


def _cdi_names_problem(names: object) -> str | None:
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return f"cdi_devices must be a sequence of strings, got {names!r:.200}"
    for name in names:
        problem = cdi_name_problem(name)
        if problem:
            return problem
    return None


def preferred_allocation_problem(
    answer: object, available: Iterable[str], must_include: Iterable[str], size: int
) -> str | None:
    """A preferred allocation holds ``size`` distinct available IDs, the must-include ones among them."""
    if not isinstance(answer, (list, tuple)) or not all(isinstance(i, str) for i in answer):
        return f"returned {type(answer).__name__}, expected a sequence of device IDs"
    if len(set(answer)) != len(answer):
        return f"returned duplicate device IDs {list(answer)}"
    if len(answer) != size:
        return f"returned {len(answer)} device IDs, the kubelet asked for {size}"
    unknown = set(answer) - set(available)
    if unknown:
        return f"returned device IDs that were not available: {sorted(unknown)}"
    missing = set(must_include) - set(answer)
    if missing:
        return f"left out device IDs that must be included: {sorted(missing)}"
    return None


def discovery_problem(answer: object) -> str | None:
    """``devicehost_discover`` returns a sequence of Resource, each holding a sequence of Device."""
    if not isinstance(answer, (list, tuple)) or not all(isinstance(r, Resource) for r in answer):
        return f"must return a list of devicehost.Resource, got {answer!r:.200}"
    for resource in answer:
        if not isinstance(resource.devices, (list, tuple)) or not all(
            isinstance(d, Device) for d in resource.devices
        ):
            return f"{resource.name}: devices must be devicehost.Device, got {resource.devices!r:.200}"
        if resource.serve_through not in SERVE_THROUGH:
            return (
                f"{resource.name}: serve_through {resource.serve_through!r:.100} must be one of"
                f" {', '.join(map(repr, SERVE_THROUGH[1:]))} or None"
            )
        if resource.unhealthy_taint not in TAINT_EFFECTS:
            return (
                f"{resource.name}: unhealthy_taint {resource.unhealthy_taint!r:.100} must be one of"
                f" {', '.join(map(repr, TAINT_EFFECTS[1:]))} or None"
            )
        problem = counter_sets_problem(resource) or hook_timeouts_problem(resource.hook_timeouts)
        if problem:
            return f"{resource.name}: {problem}"
    return None


HOOK_TIMEOUT_LIMITS = {"allocate": 45.0, "release": 45.0, "health": 30.0}
"""The most seconds a resource may declare for each hook (:class:`HookTimeouts`): what the kubelet
allows the call that waits on it. NodePrepareResources and NodeUnprepareResources, which wait on
allocate and release, get 45 s; the DRA health stream counts a driver silent for 30 s as gone. The
device plugin API's Allocate has no deadline at the kubelet (it would wait for ever, holding the
pod's admission): the same bounds apply there."""


def hook_timeouts_problem(timeouts: object) -> str | None:
    """A resource's :class:`HookTimeouts`: each None or a positive number of seconds within
    :data:`HOOK_TIMEOUT_LIMITS`."""
    if not isinstance(timeouts, HookTimeouts):
        return f"hook_timeouts must be a devicehost.HookTimeouts, got {timeouts!r:.100}"
    for hook, limit in HOOK_TIMEOUT_LIMITS.items():
        value = getattr(timeouts, hook)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
            return (
                f"hook_timeouts.{hook} {value!r:.100} must be a number of seconds above 0 and at most"
                f" {limit:g} (what the kubelet allows the call)"
            )
    return None


def counter_sets_problem(resource: Resource) -> str | None:
    """A resource's shared counter sets, and what its devices consume from them (DRA only):
    DNS-label names, at most 32 counters in all, amounts that are quantities, and every device
    consuming only counters its resource declares."""
    sets = resource.counter_sets
    problem = _counters_problem(sets, "counter set")
    if problem:
        return problem
    if sum(len(counters) for counters in sets.values()) > MAX_COUNTERS:
        return f"counter sets hold more than {MAX_COUNTERS} counters in all"
    for device in resource.devices:
        for name, counters in device.consumes.items():
            missing = sorted(set(counters) - set(sets.get(name, ())))
            if name not in sets or missing:
                what = f"counter set {name!r}" if name not in sets else f"counters {missing} of {name!r}"
                return f"device {device.id!r} consumes {what}, which the resource does not declare"
    return None


def _counters_problem(sets: object, what: str) -> str | None:
    """``{set name: {counter: amount}}``: DNS labels for both names, quantities for amounts."""
    if not isinstance(sets, Mapping):
        return f"{what}s {sets!r:.100} must be a mapping of name to counters"
    for name, counters in sets.items():
        if not isinstance(name, str) or len(name) > 63 or not _DNS1123_LABEL_RE.fullmatch(name):
            return f"{what} name {name!r:.100} must be a DNS label"
        if not isinstance(counters, Mapping) or not counters:
            return f"{what} {name}: counters {counters!r:.100} must be a non-empty mapping"
        for counter, amount in counters.items():
            if not isinstance(counter, str) or len(counter) > 63 or not _DNS1123_LABEL_RE.fullmatch(counter):
                return f"{what} {name}: counter name {counter!r:.100} must be a DNS label"
            if isinstance(amount, bool) or not (
                (isinstance(amount, int) and amount >= 0)
                or (isinstance(amount, str) and quantity.PATTERN.fullmatch(amount))
            ):
                return f"{what} {name}: counter {counter}: {amount!r:.100} must be a non-negative int or a quantity"
    return None


def devices_problem(devices: object) -> str | None:
    """A device list: devicehost.Device items with valid, unique IDs, a Health and NUMA node numbers.

    The sentence names the first device that breaks a rule.
    """
    if not isinstance(devices, (list, tuple)):
        return f"devices must be a sequence of devicehost.Device, got {devices!r:.200}"
    for device in devices:
        if not isinstance(device, Device):
            return f"devices must be devicehost.Device, got {device!r:.200}"
        problem = device_problem(device)
        if problem:
            return problem
    return device_ids_problem(d.id for d in devices)


def device_problem(device: Device) -> str | None:
    """One device: a valid ID, a :class:`Health` member, NUMA nodes as non-negative ints."""
    problem = device_ids_problem([device.id])
    if problem:
        return problem
    problem = health_value_problem(device.health)
    if problem:
        return f"device {device.id!r}: {problem}"
    nodes = device.numa_nodes
    if not isinstance(nodes, (list, tuple)) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nodes
    ):
        return f"device {device.id!r}: numa_nodes {nodes!r:.100} must be a sequence of non-negative ints"
    problem = (
        _attributes_problem(device.attributes)
        or _capacity_problem(device.capacity, device.allow_multiple_allocations)
        or _counters_problem(device.consumes, "consumed counter set")
        or binding_conditions_problem(device)
        or _pci_problem(device.pci_bus_id)
    )
    return f"device {device.id!r}: {problem}" if problem else None


def _pci_problem(bus_id: object) -> str | None:
    if bus_id is None or (isinstance(bus_id, str) and _PCI_BUS_ID.fullmatch(bus_id)):
        return None
    return f"pci_bus_id {bus_id!r:.100} must be a PCI address as sysfs names it, such as '0000:3b:00.0'"


def _attributes_problem(attributes: object) -> str | None:
    if not isinstance(attributes, Mapping):
        return f"attributes {attributes!r:.100} must be a mapping"
    for name, value in attributes.items():
        if not isinstance(name, str) or not _ATTRIBUTE_NAME.fullmatch(name):
            return f"attribute name {name!r:.100} must be a C identifier of at most 32 characters"
        if name in BUILT_IN_ATTRIBUTES:
            return f"attribute name {name!r} is the host's own (the device's {BUILT_IN_ATTRIBUTES[name]})"
        if isinstance(value, Version):
            if len(value) > 64 or not _SEMVER.fullmatch(value):
                return (
                    f"attribute {name}: version {str(value)!r:.100} is not a semantic version such as '1.0.0'"
                )
        elif not isinstance(value, (bool, int, str)) or (isinstance(value, str) and len(value) > 64):
            return (
                f"attribute {name}: {value!r:.100} must be a bool, an int, a string of at most 64"
                " characters or a devicehost.Version"
            )
    return None


def _capacity_problem(capacity: object, shared: object) -> str | None:
    """Capacities by C-identifier name, each an amount or a :class:`Capacity`; a request policy
    only on a device that allows multiple allocations (``shared``)."""
    if not isinstance(capacity, Mapping):
        return f"capacity {capacity!r:.100} must be a mapping"
    if not isinstance(shared, bool):
        return f"allow_multiple_allocations {shared!r:.100} must be a bool"
    for name, value in capacity.items():
        if not isinstance(name, str) or not _ATTRIBUTE_NAME.fullmatch(name):
            return f"capacity name {name!r:.100} must be a C identifier of at most 32 characters"
        problem = _policy_problem(value, shared) if isinstance(value, Capacity) else _amount_problem(value)
        if problem:
            return f"capacity {name}: {problem}"
    return None


def _amount_problem(value: object) -> str | None:
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 0)
        or (isinstance(value, str) and quantity.PATTERN.fullmatch(value))
    ):
        return f"{value!r:.100} must be a non-negative int or a quantity such as '16Gi'"
    return None


def _policy_problem(capacity: Capacity, shared: bool) -> str | None:
    """A :class:`Capacity`: quantities throughout, a range (``min``, with ``step``/``max``) or
    ``valid_values``, not both, and a policy only where the device is shared."""
    amounts = [capacity.value, capacity.default, capacity.min, capacity.max, capacity.step]
    for value in [*(a for a in amounts if a is not None), *capacity.valid_values]:
        problem = _amount_problem(value)
        if problem:
            return problem
    if capacity.valid_values and capacity.min is not None:
        return "a request policy has a range (min) or valid_values, not both"
    if capacity.min is None and (capacity.step is not None or capacity.max is not None):
        return "step and max need min (the range's start)"
    if capacity.has_policy and not shared:
        return (
            "a request policy needs allow_multiple_allocations=True (a device allocated whole is taken whole)"
        )
    return None


def health_problem(health: object) -> str | None:
    """A health update: a mapping of device ID (a string) to a :class:`Health` member."""
    if not isinstance(health, Mapping):
        return f"must be a mapping of device ID to devicehost.Health, got {health!r:.200}"
    for device_id, value in health.items():
        if not isinstance(device_id, str):
            return f"device ID {device_id!r:.100} must be a string"
        problem = health_value_problem(value)
        if problem:
            return f"device {device_id!r}: {problem}"
    return None


def preferred_request_problem(available: Sequence[str], must_include: Sequence[str], size: int) -> str | None:
    """A preferred-allocation request the kubelet could make: must-include IDs available, a size that fits."""
    if not set(must_include) <= set(available) or not len(must_include) <= size <= len(available):
        return (
            f"cannot pick {size} of {len(available)} available devices including {len(must_include)}"
            " must-include ones (which must all be available)"
        )
    return None


# -- binding conditions and device status (DRA only) ---------------------------------------------

MAX_BINDING_CONDITIONS = 4
"""Binding conditions, and binding failure conditions, a device may have (each)."""
MAX_STATUS_CONDITIONS = 8
MAX_STATUS_DATA = 10 * 1024
MAX_IPS = 16
_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")


def condition_type_problem(name: object) -> str | None:
    """A condition type: a qualified name (``Ready``, ``example.com/Attached``), as the API checks it."""
    if not isinstance(name, str):
        return f"condition type {name!r:.100} must be a string"
    prefix, slash, short = name.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return f"condition type {name!r:.100}: the prefix {prefix!r:.100} must be a DNS subdomain"
    if len(short) > 63 or not _QUALIFIED_NAME.fullmatch(short):
        return (
            f"condition type {name!r:.100} must be at most 63 characters of [A-Za-z0-9-_.],"
            " starting and ending with a letter or digit (an optional DNS prefix and '/' before)"
        )
    return None


def binding_conditions_problem(device: Device) -> str | None:
    """A device's binding conditions and binding failure conditions: condition types, at most 4
    each, no repeats, none in both lists, and either both lists or neither (the API's rules)."""
    lists = (
        ("binding_conditions", device.binding_conditions),
        ("binding_failure_conditions", device.binding_failure_conditions),
    )
    for what, names in lists:
        if not isinstance(names, (list, tuple)):
            return f"{what} {names!r:.100} must be a tuple of condition types"
        if len(names) > MAX_BINDING_CONDITIONS:
            return f"{what} has {len(names)} entries, at most {MAX_BINDING_CONDITIONS}"
        for name in names:
            problem = condition_type_problem(name)
            if problem:
                return f"{what}: {problem}"
        if len(set(names)) != len(names):
            return f"{what} {list(names)} repeats a condition"
    both = set(device.binding_conditions) & set(device.binding_failure_conditions)
    if both:
        return f"{sorted(both)} are both binding and binding failure conditions"
    if bool(device.binding_conditions) != bool(device.binding_failure_conditions):
        return "binding_conditions and binding_failure_conditions go together: give both or neither"
    return None


def device_status_problem(answer: object, device_ids: Iterable[str]) -> str | None:
    """What ``devicehost_device_status`` returned: a mapping of the asked device IDs to
    :class:`DeviceStatus`, each within the API's limits for ``status.devices``."""
    if not isinstance(answer, Mapping):
        return f"returned {answer!r:.200}, expected a mapping of device ID to devicehost.DeviceStatus"
    asked = set(device_ids)
    for device_id, status in answer.items():
        if device_id not in asked:
            return f"answered for device {device_id!r:.100}, which it was not asked about"
        if not isinstance(status, DeviceStatus):
            return f"device {device_id!r}: {status!r:.200} is not a devicehost.DeviceStatus"
        problem = _conditions_problem(status.conditions) or _data_problem(status.data)
        problem = problem or _network_problem(status)
        if problem:
            return f"device {device_id!r}: {problem}"
    return None


def _conditions_problem(conditions: object) -> str | None:
    if not isinstance(conditions, Mapping):
        return f"conditions {conditions!r:.100} must be a mapping of type to devicehost.DeviceCondition"
    if len(conditions) > MAX_STATUS_CONDITIONS:
        return f"{len(conditions)} conditions, at most {MAX_STATUS_CONDITIONS}"
    for name, condition in conditions.items():
        problem = condition_type_problem(name)
        if problem:
            return problem
        if not isinstance(condition, DeviceCondition) or not isinstance(condition.status, bool):
            return f"condition {name}: {condition!r:.100} must be a devicehost.DeviceCondition with a bool status"
        if (
            not isinstance(condition.reason, str)
            or len(condition.reason) > 1024
            or not (_CONDITION_REASON.fullmatch(condition.reason))
        ):
            return f"condition {name}: reason {condition.reason!r:.100} must be one CamelCase word (at most 1024 characters)"
        if not isinstance(condition.message, str) or len(condition.message) > 32768:
            return f"condition {name}: message must be a string of at most 32768 characters"
    return None


def _data_problem(data: object) -> str | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        return f"data {data!r:.100} must be a mapping (JSON) or None"
    try:
        size = len(json.dumps(data, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        return f"data is not JSON: {exc}"
    if size > MAX_STATUS_DATA:
        return f"data is {size} bytes as JSON, at most {MAX_STATUS_DATA}"
    return None


def _network_problem(status: DeviceStatus) -> str | None:
    network = status.network
    if network is None:
        return None
    if not isinstance(network, NetworkData):
        return f"network {network!r:.100} must be a devicehost.NetworkData or None"
    if not isinstance(network.interface_name, str) or len(network.interface_name) > 256:
        return f"network interface_name {network.interface_name!r:.100} must be at most 256 characters"
    if not isinstance(network.hardware_address, str) or len(network.hardware_address) > 128:
        return f"network hardware_address {network.hardware_address!r:.100} must be at most 128 characters"
    ips = network.ips
    if not isinstance(ips, (list, tuple)) or len(ips) > MAX_IPS or len(set(ips)) != len(ips):
        return f"network ips {ips!r:.200} must be a tuple of at most {MAX_IPS} distinct addresses"
    for ip in ips:
        try:
            ipaddress.ip_interface(ip if isinstance(ip, str) and "/" in ip else "not CIDR")
        except ValueError:
            return f"network ip {ip!r:.100} is not in CIDR notation (10.9.8.7/24)"
    return None
