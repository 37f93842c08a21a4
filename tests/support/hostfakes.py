"""Backends scripted by tests, and a way to run the real Host in-process against them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import structlog
import structlog.testing

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, Resource, cdi
from devicehost.host.app import running
from devicehost.host.backends.backend import Backend
from devicehost.host.config import HostConfig
from devicehost.host.daemon import Host
from devicehost.testing.host import beside_kubelet


def widgets(name: str, count: int, prefix: str = "w") -> Resource:
    return Resource(name, tuple(Device(f"{prefix}{n}", numa_nodes=(n % 2,)) for n in range(count)))


class ScriptedBackend:
    """A backend whose answers the test sets; records what the host called."""

    def __init__(self, *resources: Resource) -> None:
        self.resources = list(resources)
        self.health: dict[str, Health] | None = None
        self.allocate_error: Exception | None = None
        self.allocate_answer: object | None = None
        self.discover_error: Exception | None = None
        self.hang = threading.Event()  # hooks listed in hanging wait on it
        self.hanging: set[str] = set()
        self.notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _record(self, hook: str, resource: str = "") -> None:
        with self.lock:
            self.calls.append((hook, resource))
        if hook in self.hanging:
            self.hang.wait(30)

    def count(self, hook: str, resource: str | None = None) -> int:
        with self.lock:
            return sum(h == hook and (resource is None or r == resource) for h, r in self.calls)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        self._record("devicehost_discover")
        if self.discover_error is not None:
            raise self.discover_error
        return list(self.resources)

    @devicehost.hookimpl
    def devicehost_health(self, resource: str) -> Mapping[str, Health] | None:
        self._record("devicehost_health", resource)
        return self.health

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        self._record("devicehost_start", resource)
        self.notifiers[resource] = notifier

    @devicehost.hookimpl
    def devicehost_stop(self, resource: str) -> None:
        self._record("devicehost_stop", resource)

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> object:
        self._record("devicehost_allocate", resource)
        if self.allocate_error is not None:
            raise self.allocate_error
        if self.allocate_answer is not None:
            return self.allocate_answer
        return ContainerAllocation(
            envs={"IDS": ",".join(device_ids)},
            devices=[
                DeviceSpec(container_path=f"/dev/{i}", host_path="/dev/null", permissions="rw")
                for i in device_ids
            ],
        )


class TopologyBackend(ScriptedBackend):
    """Adds the optional hooks: preferred allocation (lowest IDs first) and pre-start."""

    def __init__(self, *resources: Resource) -> None:
        super().__init__(*resources)
        self.pre_started: list[tuple[str, ...]] = []

    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: devicehost.PreferredAllocationRequest) -> list[str]:
        self._record("devicehost_preferred_allocation")
        rest = [i for i in sorted(request.available) if i not in request.must_include]
        return [*request.must_include, *rest][: request.size]

    @devicehost.hookimpl
    def devicehost_pre_start_container(self, device_ids: tuple[str, ...]) -> None:
        self._record("devicehost_pre_start_container")
        self.pre_started.append(device_ids)


@contextlib.asynccontextmanager
async def running_host(
    directory: Path, backends: Mapping[str, object], **settings: Any
) -> AsyncIterator[Host]:
    """The real Host serving ``backends`` (name -> plugin object) into ``directory``."""
    settings.setdefault("hook_timeout", 2.0)
    failed = settings.pop("failed_backends", None)
    settings.setdefault("pod_resources_socket", beside_kubelet(directory))
    settings.setdefault("cdi_dir", cdi.default_dir())  # the test's own (tests/support/cdi_guard.py)
    config = HostConfig(device_plugins_dir=directory, **settings)
    loaded = [Backend(name, plugin, config.hook_timeout) for name, plugin in backends.items()]
    async with running(config, loaded, failed_backends=failed) as host:
        try:
            yield host
        finally:
            for plugin in backends.values():
                if isinstance(plugin, ScriptedBackend):
                    plugin.hang.set()


def socket_files(directory: Path) -> Sequence[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("devicehost-"))


def install_fake_distribution(site: Path, name: str, module: str, source: str, entry_points: str) -> None:
    """Make ``name`` look pip-installed under ``site``: a module and a dist-info with entry points."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{name.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[devicehost.backends]\n{entry_points}\n")
    (info / "top_level.txt").write_text(f"{module}\n")
    (info / "RECORD").write_text(f"{module}.py,,\n")


GOOD_BACKEND = """
import devicehost

@devicehost.hookimpl
def devicehost_discover():
    return [devicehost.Resource("good.example.com/thing", (devicehost.Device("t0"), devicehost.Device("t1")))]

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation(envs={"THINGS": ",".join(device_ids)})
"""

BROKEN_IMPORT = "import no_such_driver_module\n"

ASYNC_BACKEND = """
import devicehost

@devicehost.hookimpl
async def devicehost_discover():
    return []

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()
"""

TYPO_BACKEND = """
import devicehost

@devicehost.hookimpl
def devicehost_discover():
    return []

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()

@devicehost.hookimpl
def devicehost_alocate(device_ids):
    return None
"""


def install_test_backends(site: Path) -> None:
    """A good backend beside three broken ones: import error, async hook, unknown hook."""
    install_fake_distribution(site, "devicehost-good", "dh_good", GOOD_BACKEND, "good = dh_good")
    install_fake_distribution(site, "devicehost-broken", "dh_broken", BROKEN_IMPORT, "broken = dh_broken")
    install_fake_distribution(site, "devicehost-asyncy", "dh_asyncy", ASYNC_BACKEND, "asyncy = dh_asyncy")
    install_fake_distribution(site, "devicehost-typo", "dh_typo", TYPO_BACKEND, "typo = dh_typo")


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog line while active, with bound contextvars (``resource=``, ``backend=``) merged.

    ``structlog.testing.capture_logs(processors=...)`` does this only from structlog 25.5; the
    ``min`` env runs 24.1.
    """
    capture = structlog.testing.LogCapture()
    old = structlog.get_config()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, capture], cache_logger_on_first_use=False
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(**old)
