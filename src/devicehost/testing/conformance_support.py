"""What the conformance suite checks with: its rules, the backend called directly, leak probes.

Every failure names one of :data:`RULES` as ``[rule-id]`` and says what the backend did.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devicehost import quantity
from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Device, Health, Resource
from devicehost.host import reconcile
from devicehost.host.backends.backend import new_plugin_manager
from devicehost.host.backends.loader import UnknownBackendError, load_backends
from devicehost.standin.cdi_runtime import definitions

__all__ = ["CHECKS", "RULES", "DirectBackend", "broken", "cdi_resolution", "load_plugin"]

RULES = {
    "entry-point": "the backend loads through its devicehost.backends entry point, as the host loads it",
    "sync-hooks": "every hook implementation is a plain (synchronous) def",
    "required-hooks": "devicehost_discover and devicehost_allocate are implemented",
    "hook-specs": "every @devicehost.hookimpl names a hook spec and takes only that spec's arguments",
    "settings": "devicehost_configure accepts the settings given with --devicehost-settings",
    "discovery-shape": "devicehost_discover returns a sequence of devicehost.Resource holding devicehost.Device",
    "has-devices": "with the settings given, discovery offers at least one valid resource with devices",
    "resource-name": "every resource name passes the kubelet's IsExtendedResourceName rule",
    "device-id": "device IDs are non-empty, at most 63 characters and unique within their resource",
    "stable-discovery": "two discoveries in a row give the same resource names and device IDs",
    "health-values": "health is Healthy or Unhealthy, and devicehost_health names only the resource's devices",
    "health-both-ways": "a device the backend can make Unhealthy turns Healthy again (devicehost_conformance_set_health)",
    "start-hook": "devicehost_start succeeds for every resource the host would serve",
    "cdi-names": "every CDI device name an allocation returns resolves as a runtime with CDI resolves it when the answer comes: exactly one valid spec in the CDI dir defines it",
    "reload": "after a reload with new settings, every device still allocates and its CDI names resolve",
    "allocation-answer": "devicehost_allocate answers every healthy device with a well-formed ContainerAllocation",
    "allocation-wire": "every advertised healthy device can be allocated by the kubelet over the wire, to a pod of its own (devices whose shared counters cannot all be held at once, a card and its partitions, group after group: a group's pods end, and the host lets their devices go, before the next)",
    "admission": "the kubelet's admission (GetPreferredAllocation, Allocate, PreStartContainer) succeeds (without GetPreferredAllocation, for devices sharing counters, of devices the counters let it hold at once)",
    "unknown-ids-host": "Allocate of unknown device IDs gets INVALID_ARGUMENT from the host",
    "unknown-ids-backend": "devicehost_allocate raises for device IDs the resource does not have",
    "start-stop": "devicehost_start/devicehost_stop can be repeated and stop releases what start took",
    "preferred-allocation": "devicehost_preferred_allocation returns exactly size distinct available IDs, must-include ones among them",
    "kubelet-restart": "every resource registers again, with its devices, after the kubelet restarts",
    "device-release": "devicehost_release returns for devices a pod held, and they are allocatable again after it",
    "dra-slices": "served through DRA, each resource's healthy devices are published in its ResourceSlice, with names and attributes the API server accepts",
    "dra-prepare": "a claim of one device (and of two whose shared counters hold both) is prepared through the kubelet: its devices, in the resource's pool, with CDI IDs a spec in the CDI dir defines; asked again, the same answer",
    "dra-unprepare": "a claim unprepared through the kubelet reaches devicehost_release (when implemented), leaves the host, and its device can be prepared again",
    "dra-config": "a claim whose configuration the backend's claim config model takes (its JSON schema examples, else one built from its required fields) is prepared, and the allocate hook gets an instance of the model; without a model, any mapping is prepared and arrives as given",
    "dra-config-refused": "a claim whose configuration the model refuses (an unknown key) fails alone, naming the key path, without an allocate call, and the other claims of the same call are prepared: a model refuses with ValueError (pydantic's ValidationError), never another exception",
    "dra-admin-access": "an admin-access claim of a device a normal claim holds is prepared (the hook gets admin_access=True: it must not refuse a device another claim holds), and unpreparing it leaves the normal claim prepared",
    "dra-subrequest": "a claim a prioritized list allocated (request 'request/subrequest') is prepared, its devices answered for 'request/subrequest' with valid CDI names a spec in the CDI dir defines",
    "dra-shares": "two claims of a device that allows multiple allocations are both prepared, the allocate hook getting each claim's share (ClaimRequest.shares, its shareID), and unpreparing one releases that share alone (the release hook gets it) and leaves the other claim prepared",
    "dra-counters": "a resource with counter_sets (checked whether or not --devicehost-dra is given: any resource may be served through DRA): every device consumes only declared counters, none more of a counter than its set holds (it could never be allocated); through DRA, the pool's counters slice holds exactly the declared sets, and a claim of a consuming device (a partition) is prepared",
    "dra-config-used": "two configurations the backend offers as examples (its claim config model's JSON schema examples), which its model reads as different, give a container different edits (what the claim's CDI devices resolve to), unless the model declares its configuration inert (\"x-devicehost-inert\": true)",
    "dra-release-scope": "unpreparing one claim leaves another claim on the same hardware as it was (two partitions drawing on one counter set, two shares of one device; else two devices): its CDI devices still resolve to the same container edits, and its devices are still Healthy by devicehost_health",
    "dra-device-status": "a backend with devicehost_device_status answers for the devices it is asked about with well-formed devicehost.DeviceStatus values (before and after prepare), and reports a device's binding conditions until the host sees them all True (a claim of the device becomes bindable)",
    "dra-health": "a device the backend makes Unhealthy leaves its ResourceSlice and comes back when Healthy again (devicehost_conformance_set_health)",
}
"""The ``dra-*`` rules run only with ``--devicehost-dra`` (see :mod:`devicehost.testing.conformance_dra`),
but for ``dra-counters``' check of the declared counters."""

CHECKS = {
    "test_loads_through_its_entry_point": "entry-point",
    "test_hooks_are_synchronous": "sync-hooks",
    "test_required_hooks_are_implemented": "required-hooks",
    "test_hooks_match_their_specs": "hook-specs",
    "test_resource_names_follow_the_kubelet_rule": "resource-name",
    "test_device_ids_follow_the_kubelet_rule": "device-id",
    "test_offers_devices": "has-devices",
    "test_discovery_is_stable": "stable-discovery",
    "test_health_values_are_valid": "health-values",
    "test_health_goes_both_ways": "health-both-ways",
    "test_allocation_answers_are_well_formed": "allocation-answer",
    "test_backend_refuses_unknown_ids": "unknown-ids-backend",
    "test_every_device_allocates_over_the_wire": "allocation-wire",
    "test_cdi_names_are_defined": "cdi-names",
    "test_reload_keeps_allocations_working": "reload",
    "test_kubelet_admission_succeeds": "admission",
    "test_host_refuses_unknown_ids": "unknown-ids-host",
    "test_preferred_allocation_is_well_formed": "preferred-allocation",
    "test_start_hook_succeeds": "start-hook",
    "test_start_and_stop_repeat_and_release": "start-stop",
    "test_survives_a_kubelet_restart": "kubelet-restart",
    "test_released_devices_come_back": "device-release",
    "test_counters_are_declared_and_fit": "dra-counters",
    "test_dra_publishes_every_resource": "dra-slices",
    "test_dra_claims_are_prepared": "dra-prepare",
    "test_dra_unprepare_releases": "dra-unprepare",
    "test_dra_claim_config_reaches_the_hook": "dra-config",
    "test_dra_refused_config_fails_its_claim_alone": "dra-config-refused",
    "test_dra_admin_access_shares_a_held_device": "dra-admin-access",
    "test_dra_subrequest_claims_are_prepared": "dra-subrequest",
    "test_dra_shares_are_prepared_and_released_apart": "dra-shares",
    "test_dra_counters_fit_and_partitions_are_prepared": "dra-counters",
    "test_dra_claim_config_changes_what_a_container_gets": "dra-config-used",
    "test_dra_release_leaves_other_holders_alone": "dra-release-scope",
    "test_dra_device_status_answers_for_its_devices": "dra-device-status",
    "test_dra_unhealthy_devices_leave_the_slice": "dra-health",
}
"""The rule each check of the suite holds the backend to, by test name: how the suite names the
rules it skips, and why, at the end of its report."""

HEALTH_HOOK = "devicehost_conformance_set_health"
"""The optional test-seam hook (see :mod:`devicehost.hookspecs.spec`): having it declares that
health goes both ways."""
LEGACY_HEALTH_TOGGLE = "conformance_set_health"
"""Its old spelling, a plain method found by name: still used for one release, with a warning."""

UNKNOWN_ID = "devicehost-conformance-no-such-device"
LOAD_HOOK_TIMEOUT = 5.0
"""The hook timeout of the ``Backend`` the loader builds; unused, as the suite calls hooks directly."""
THREAD_EXIT_WAIT = 2.0


def broken(rule: str, detail: str) -> NoReturn:
    """Fail the current check, naming the rule and what the backend did (and nothing else)."""
    raise pytest.fail.Exception(f"[{rule}] {RULES[rule]}: {detail}", pytrace=False) from None


def load_plugin(name: str, hook_timeout: float = LOAD_HOOK_TIMEOUT) -> object:
    """The backend object behind entry point ``name``, loaded by the host's own loader.

    Classes are instantiated with no arguments, as the host does. Only a failure to import or
    to instantiate breaks "entry-point" here: a backend object that the host then refuses for
    the hook contract is still returned, so that the contract checks can name their own rules.
    """
    try:
        [status] = load_backends([name], (), hook_timeout)
    except UnknownBackendError as exc:
        broken("entry-point", str(exc))
    if status.backend is not None:
        status.backend.close()  # only the object is needed: its hooks are called in this thread
    if status.plugin is None:
        broken("entry-point", status.error or "the host's loader gave no backend object")
    return status.plugin


def health_toggle(direct: DirectBackend) -> Callable[[str, str, Health], None] | None:
    """How the suite makes a device turn a health: the test-seam hook, or its old spelling."""
    if direct.implements(HEALTH_HOOK):

        def toggle(resource: str, device_id: str, health: Health) -> None:
            direct.hook.devicehost_conformance_set_health(
                resource=resource, device_id=device_id, health=health
            )

        return toggle
    legacy = getattr(direct.plugin, LEGACY_HEALTH_TOGGLE, None)
    if legacy is None:
        return None
    warnings.warn(
        f"{direct.name}: a plain {LEGACY_HEALTH_TOGGLE}() method is deprecated and will be ignored in"
        f" the next release; implement @devicehost.hookimpl {HEALTH_HOOK}(resource, device_id, health)",
        DeprecationWarning,
        stacklevel=2,
    )
    return legacy  # type: ignore[no-any-return]


@contextlib.contextmanager
def fault_cleared(
    toggle: Callable[[str, str, Health], None], resource: str, device_id: str
) -> Iterator[None]:
    """Make ``device_id`` Healthy again on the way out, whether the check passed or failed: a
    fault the suite set (in a fault file, in the hardware) must not outlive the check and make
    the next run skip what needs a healthy device."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the check's own failure is what to report
            toggle(resource, device_id, Health.HEALTHY)
        raise
    try:
        toggle(resource, device_id, Health.HEALTHY)
    except Exception as exc:
        broken("health-both-ways", f"clearing the fault of {device_id} raised {type(exc).__name__}: {exc}")


def start_problem(direct: DirectBackend, resources: Sequence[Resource]) -> str | None:
    """Start (and stop again) each resource directly; the first start failure, with its exception."""
    if not direct.implements("devicehost_start"):
        return None
    for resource in resources:
        try:
            direct.hook.devicehost_start(resource=resource.name, notifier=NullNotifier())
        except Exception as exc:
            return f"devicehost_start({resource.name!r}) raised {type(exc).__name__}: {exc}\n{_backend_trace(exc)}"
        with contextlib.suppress(Exception):  # a failing stop is the start-stop rule's to report
            direct.hook.devicehost_stop(resource=resource.name)
    return None


def _backend_trace(exc: BaseException) -> str:
    """The exception's traceback from the backend's frames only (no pluggy, no kit)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/pluggy/" not in f.filename][1:]
    lines = traceback.format_list(frames) + traceback.format_exception_only(exc)
    return "Traceback (the backend's frames):\n" + "".join(lines).rstrip()


def cdi_resolution(names: Sequence[str], cdi_dir: Path) -> tuple[dict[str, list[Any]], list[str]]:
    """``names`` resolved as a container runtime with CDI resolves them now (the stand-in runtime,
    :mod:`devicehost.standin.cdi_runtime`): the container edits they give together (each kind of
    edit, sorted), and a problem for each name no valid spec defines, or that two specs define (a
    runtime refuses such a name)."""
    defined, refused = definitions(cdi_dir)
    edits: dict[str, list[Any]] = {"env": [], "deviceNodes": [], "mounts": [], "hooks": []}
    problems = []
    for name in names:
        found = defined.get(name, [])
        if len(found) != 1:
            where = (
                f"defined by {len(found)} specs ({', '.join(p.name for p, _ in found)})"
                if found
                else "defined by no spec"
            )
            why = "; ".join(f"{p.name} skipped: {w}" for p, w in refused.items())
            problems.append(f"{name!r}: {where} in the CDI dir{f' ({why})' if why and not found else ''}")
            continue
        for kind, values in found[0][1].items():
            edits.setdefault(kind, []).extend(values)
    return {k: sorted(v, key=repr) for k, v in edits.items()}, problems


def undefined_cdi_names(names: Sequence[str], cdi_dir: Path) -> list[str]:
    """What a runtime says of each CDI device name in ``names`` it cannot resolve from ``cdi_dir``
    now (a pod handed one fails to start)."""
    return cdi_resolution(names, cdi_dir)[1]


class DirectBackend:
    """The backend's hooks called in this thread through pluggy, as the host calls them."""

    def __init__(self, name: str, plugin: object) -> None:
        self.name = name
        self.plugin = plugin
        self._pm = new_plugin_manager(name, plugin)

    @property
    def hook(self) -> Any:
        """pluggy's hook relay: ``direct.hook.devicehost_discover()``."""
        return self._pm.hook

    def implements(self, hook: str) -> bool:
        """Whether the backend has an implementation of ``hook``."""
        return bool(getattr(self._pm.hook, hook).get_hookimpls())

    def discover(self) -> list[Resource]:
        """One discovery, its shape checked with the host's own rule."""
        try:
            answer = self.hook.devicehost_discover()
        except (TypeError, ValueError) as exc:  # devicehost.Device and Resource refuse bad values
            broken("discovery-shape", f"devicehost_discover raised {type(exc).__name__}: {exc}")
        if answer is None:
            return []
        problem = rules.discovery_problem(answer)
        if problem:
            broken("discovery-shape", problem)
        return list(answer)


def servable(resources: Sequence[Resource]) -> list[Resource]:
    """The resources the host would serve from this discovery: its own plan, nothing served yet."""
    return [resource for _, resource in reconcile.plan([("backend", resources)], {}).add]


def held_together(resource: Resource, ids: Sequence[str]) -> list[list[str]]:
    """``ids`` in groups whose devices the kubelet can hold at once: in order, each device joins
    the first group whose devices it fits the resource's counter sets with (a card and its
    partitions draw on one set, so they fall into different groups). A device that overdraws a
    set alone (``dra-counters`` names it) counts for nothing, as the host leaves it out of its
    counter math. Without counter sets, one group."""
    by_id = {d.id: d for d in resource.devices}
    groups: list[tuple[list[str], list[Device]]] = []
    for device_id in ids:
        device = by_id.get(device_id)
        counted = [device] if device is not None and device.consumes and _fit(resource, [device]) else []
        group = next((g for g in groups if _fit(resource, [*g[1], *counted])), None)
        if group is None:
            group = ([], [])
            groups.append(group)
        group[0].append(device_id)
        group[1].extend(counted)
    return [chosen for chosen, _ in groups]


def _fit(resource: Resource, devices: Sequence[Device]) -> bool:
    """Whether ``devices`` together take no more of any declared counter than its set holds."""
    for name, counters in resource.counter_sets.items():
        for counter, amount in counters.items():
            taken = sum(
                quantity.parse(d.consumes[name].get(counter, 0)) for d in devices if name in d.consumes
            )
            if taken > quantity.parse(amount):
                return False
    return True


def healthy_ids(resource: Resource) -> list[str]:
    """IDs of the resource's devices that discovery reported Healthy."""
    return [d.id for d in resource.devices if d.health == Health.HEALTHY]


class NullNotifier:
    """A ResourceNotifier for direct start calls: counts what the backend pushes."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def _count(self) -> None:
        with self._lock:
            self.calls += 1

    def set_health(self, health: object) -> None:
        self._count()

    def set_devices(self, devices: object) -> None:
        self._count()

    def rediscover(self) -> None:
        self._count()


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what they point at."""
    found = {}
    for entry in Path("/proc/self/fd").iterdir():
        try:
            found[int(entry.name)] = os.readlink(entry)
        except OSError:  # the fd of the directory listing itself, closed by now
            continue
    return found


def leaks_after(action: Callable[[], None]) -> list[str]:
    """Threads and file descriptors that ``action`` left behind (threads get a moment to end)."""
    threads = set(threading.enumerate())
    fds = open_fds()
    action()
    left = [t for t in threading.enumerate() if t not in threads]
    deadline = time.monotonic() + THREAD_EXIT_WAIT
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    leaks = [f"thread {t.name!r}" for t in left if t.is_alive()]
    leaks += [f"fd {fd} -> {target}" for fd, target in open_fds().items() if fds.get(fd) != target]
    return leaks
