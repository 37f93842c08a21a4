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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devicehost.hookspecs import rules
from devicehost.hookspecs.types import Health, Resource
from devicehost.host import reconcile
from devicehost.host.backends.backend import new_plugin_manager
from devicehost.host.backends.loader import UnknownBackendError, load_backends
from devicehost.standin.cdi_runtime import registry as cdi_registry

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
    "cdi-names": "every CDI device name an allocation returns is defined by a spec in the CDI dir",
    "reload": "after a reload with new settings, every device still allocates and its CDI names resolve",
    "allocation-answer": "devicehost_allocate answers every healthy device with a well-formed ContainerAllocation",
    "allocation-wire": "every advertised healthy device can be allocated by the kubelet over the wire",
    "admission": "the kubelet's admission (GetPreferredAllocation, Allocate, PreStartContainer) succeeds",
    "unknown-ids-host": "Allocate of unknown device IDs gets INVALID_ARGUMENT from the host",
    "unknown-ids-backend": "devicehost_allocate raises for device IDs the resource does not have",
    "start-stop": "devicehost_start/devicehost_stop can be repeated and stop releases what start took",
    "preferred-allocation": "devicehost_preferred_allocation returns exactly size distinct available IDs, must-include ones among them",
    "kubelet-restart": "every resource registers again, with its devices, after the kubelet restarts",
    "device-release": "devicehost_release returns for devices a pod held, and they are allocatable again after it",
    "dra-slices": "served through DRA, each resource's healthy devices are published in its ResourceSlice, with names and attributes the API server accepts",
    "dra-prepare": "a claim of one device (and of two) is prepared through the kubelet: its devices, in the resource's pool, with CDI IDs a spec in the CDI dir defines; asked again, the same answer",
    "dra-unprepare": "a claim unprepared through the kubelet reaches devicehost_release (when implemented), leaves the host, and its device can be prepared again",
    "dra-config": "a claim whose configuration the backend's claim config model takes (its JSON schema examples, else one built from its required fields) is prepared, and the allocate hook gets an instance of the model; without a model, any mapping is prepared and arrives as given",
    "dra-config-refused": "a claim whose configuration the model refuses (an unknown key) fails alone, naming the key path, without an allocate call, and the other claims of the same call are prepared: a model refuses with ValueError (pydantic's ValidationError), never another exception",
    "dra-admin-access": "an admin-access claim of a device a normal claim holds is prepared (the hook gets admin_access=True: it must not refuse a device another claim holds), and unpreparing it leaves the normal claim prepared",
    "dra-subrequest": "a claim a prioritized list allocated (request 'request/subrequest') is prepared, its devices answered for 'request/subrequest' with valid CDI names a spec in the CDI dir defines",
    "dra-shares": "two claims of a device that allows multiple allocations are both prepared, the allocate hook getting each claim's share (ClaimRequest.shares, its shareID), and unpreparing one releases that share alone (the release hook gets it) and leaves the other claim prepared",
    "dra-counters": "a resource with counter_sets: no device consumes more of a counter than its set holds (it could never be allocated), the pool's counters slice holds exactly the declared sets, and a claim of a consuming device (a partition) is prepared",
    "dra-device-status": "a backend with devicehost_device_status answers for the devices it is asked about with well-formed devicehost.DeviceStatus values (before and after prepare), and reports a device's binding conditions until the host sees them all True (a claim of the device becomes bindable)",
    "dra-health": "a device the backend makes Unhealthy leaves its ResourceSlice and comes back when Healthy again (devicehost_conformance_set_health)",
}
"""The ``dra-*`` rules run only with ``--devicehost-dra`` (see :mod:`devicehost.testing.conformance_dra`)."""

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


def undefined_cdi_names(names: Sequence[str], cdi_dir: Path) -> list[str]:
    """The CDI device names that do not resolve in ``cdi_dir`` as containerd 1.7 resolves them (a
    pod handed one fails to start): no spec defines them, or only one the runtime refuses."""
    defined = cdi_registry([cdi_dir])
    return [name for name in names if name not in defined]


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
