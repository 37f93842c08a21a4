"""BackendSet: the loaded backends and the failed ones, over real Backend objects."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.backends.backend import Backend, HookTimeout
from devicehost.host.backends.backend_set import BackendSet
from devicehost.host.backends.loader import UnknownBackendError
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.state import BackendState

THREAD_EXIT_WAIT = 5.0
"""Seconds a test waits for a closed backend's idle worker thread to exit."""


class Minimal:
    """Only the required hooks."""

    def __init__(self, name: str = "example.com/widget") -> None:
        self.resources = [Resource(name, (Device("w0"),))]
        self.discover_error: Exception | None = None
        self.release = threading.Event()
        self.hang_discover = False

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        if self.hang_discover:
            self.release.wait(30)
        if self.discover_error is not None:
            raise self.discover_error
        return self.resources

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})


class Configurable(Minimal):
    """Keeps every settings mapping it accepts; refuses one with a ``bad`` key."""

    def __init__(self, name: str = "example.com/widget") -> None:
        super().__init__(name)
        self.settings: list[dict[str, Any]] = []

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
        if "bad" in settings:
            raise ValueError(f"bad is not a setting (got {settings['bad']!r})")
        self.settings.append(dict(settings))


Make = Callable[..., Backend]


@pytest.fixture
def make() -> Iterator[Make]:
    """Build Backends; every one is closed and every hung hook released at the end."""
    made: list[tuple[Backend, Minimal]] = []

    def build(name: str, plugin: Minimal, hook_timeout: float = 2.0) -> Backend:
        backend = Backend(name, plugin, hook_timeout)
        made.append((backend, plugin))
        return backend

    yield build
    for backend, plugin in made:
        plugin.release.set()
        backend.close()


def worker_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"backend-{name}_")]


def assert_threads_exit(threads: list[threading.Thread]) -> None:
    assert threads, "the backend ran a hook, so it has a worker thread"
    for thread in threads:
        thread.join(THREAD_EXIT_WAIT)
    assert not [t.name for t in threads if t.is_alive()], "the backend was not closed"


async def test_configure_all_hands_each_backend_its_settings(make: Make) -> None:
    good, other = Configurable(), Configurable()
    backends = BackendSet([make("good", good), make("other", other), make("plain", Minimal())])
    await backends.configure_all({"good": {"x": 1}})
    assert good.settings == [{"x": 1}]
    assert other.settings == [{}]
    assert list(backends.loaded) == ["good", "other", "plain"]
    assert backends.failed == {}


async def test_configure_all_drops_a_backend_that_refuses_its_settings(make: Make) -> None:
    good, refuser = Configurable(), Configurable()
    backends = BackendSet(
        [make("good", good), make("refuser", refuser), make("plain", Minimal())],
        failed={"earlier": "failed to load"},
    )
    await backends.configure_all({"good": {"x": 1}, "refuser": {"bad": 2}})
    assert list(backends.loaded) == ["good", "plain"]
    assert [b.name for b in backends] == ["good", "plain"]
    assert backends.failed == {
        "earlier": "failed to load",
        "refuser": "settings refused: backend 'refuser' devicehost_configure raised ValueError: "
        "bad is not a setting (got 2)",
    }
    assert good.settings == [{"x": 1}]


async def test_configure_all_drops_a_backend_whose_configure_hangs(make: Make) -> None:
    class Hanging(Configurable):
        @devicehost.hookimpl
        def devicehost_configure(self, settings: Mapping[str, Any]) -> None:
            self.release.wait(30)

    backends = BackendSet([make("slow", Hanging(), hook_timeout=0.05), make("plain", Minimal())])
    await backends.configure_all({})
    assert list(backends.loaded) == ["plain"]
    assert backends.failed == {
        "slow": "settings refused: backend 'slow' devicehost_configure did not return within 0.05 s"
    }


async def test_a_backend_dropped_by_configure_all_is_closed(make: Make) -> None:
    backends = BackendSet([make("dropped", Configurable())])
    await backends.configure_all({"dropped": {"bad": 1}})
    assert "dropped" in backends.failed
    # Nothing holds the dropped backend any more: if it is not closed, its thread pool lives on.
    assert_threads_exit(worker_threads("dropped"))


async def test_reconfigure_passes_new_settings(make: Make) -> None:
    plugin = Configurable()
    backends = BackendSet([make("b", plugin)])
    await backends.configure_all({"b": {"x": 1}})
    await backends.reconfigure("b", {"x": 2})
    assert plugin.settings == [{"x": 1}, {"x": 2}]


async def test_a_refused_reconfigure_keeps_the_backend_loaded(make: Make) -> None:
    plugin = Configurable()
    backends = BackendSet([make("b", plugin)])
    await backends.configure_all({"b": {"x": 1}})
    await backends.reconfigure("b", {"bad": 1})
    assert list(backends.loaded) == ["b"]
    assert backends.failed == {}
    assert plugin.settings == [{"x": 1}], "the backend keeps its previous settings"
    assert backends.loaded["b"].failures == {"devicehost_configure": 1}


async def test_disable_withdraws_then_closes_the_backend(make: Make) -> None:
    backends = BackendSet([make("gone", Configurable()), make("stays", Minimal())])
    await backends.configure_all({})
    threads = worker_threads("gone")
    withdrawn: list[tuple[str, list[str]]] = []

    async def withdraw(backend: Backend) -> None:
        withdrawn.append((backend.name, list(backends.loaded)))

    await backends.disable("gone", withdraw)
    assert withdrawn == [("gone", ["stays"])], "withdrawn once, after it left the loaded set"
    assert list(backends.loaded) == ["stays"]
    assert "gone" not in backends.failed
    assert_threads_exit(threads)
    assert [b.name for b in backends] == ["stays"]


async def test_a_reloaded_hook_timeout_reaches_every_loaded_backend(make: Make) -> None:
    slow = Minimal()
    slow.hang_discover = True
    context = HostContext(HostConfig(hook_timeout=30.0))
    backends = BackendSet(
        [make("slow", slow, hook_timeout=30.0), make("other", Minimal(), hook_timeout=30.0)], {}, context
    )
    context.config = context.config.model_copy(update={"hook_timeout": 0.05})  # what a reload does
    assert [b.link.hook_timeout for b in backends] == [0.05, 0.05]
    with pytest.raises(HookTimeout, match=r"devicehost_discover did not return within 0\.05 s"):
        await backends.loaded["slow"].discover()


async def test_discover_gives_none_for_a_failed_discovery(make: Make) -> None:
    good, broken = Minimal("example.com/good"), Minimal("example.com/broken")
    broken.discover_error = OSError("driver gone")
    backends = BackendSet([make("broken", broken), make("good", good)])
    answers = [(b.name, await backends.discover(b)) for b in backends]
    assert answers == [("broken", None), ("good", good.resources)]


async def test_states_of_loaded_and_failed_backends(make: Make) -> None:
    backends = BackendSet([make("fine", Minimal())], failed={"broken": "failed to load"})
    assert backends.states() == (
        BackendState("fine", True, stuck_hooks=(), hook_failures={}),
        BackendState("broken", False, "failed to load"),
    )


async def test_states_report_stuck_hooks_and_hook_failures(make: Make) -> None:
    stuck, failing = Minimal(), Minimal()
    stuck.hang_discover = True
    failing.discover_error = RuntimeError("boom")
    backends = BackendSet([make("stuck", stuck, hook_timeout=0.05), make("failing", failing)])
    assert await asyncio.gather(*(backends.discover(b) for b in backends)) == [None, None]
    # A hook counts as stuck once it has run for longer than the hook timeout: wait for that.
    async with asyncio.timeout(5):
        while not backends.loaded["stuck"].stuck_hooks():
            await asyncio.sleep(0.01)
    states = {s.name: s for s in backends.states()}
    assert states["stuck"] == BackendState(
        "stuck",
        True,
        stuck_hooks=("devicehost_discover",),
        hook_failures={"devicehost_discover": 1},
        discovery_error="backend 'stuck' devicehost_discover did not return within 0.05 s",
    )
    assert states["failing"] == BackendState(
        "failing",
        True,
        stuck_hooks=(),
        hook_failures={"devicehost_discover": 1},
        discovery_error="backend 'failing' devicehost_discover raised RuntimeError: boom",
    )


async def test_close_closes_every_loaded_backend(make: Make) -> None:
    backends = BackendSet([make("one", Configurable()), make("two", Configurable())])
    await backends.configure_all({})
    threads = worker_threads("one") + worker_threads("two")
    backends.close()
    assert_threads_exit(threads)


# load(): real entry-point backends installed in the venv (example, hostdev, nvidia,
# broken-conformance), plus the broken ones of the fake_site fixture.


@pytest.fixture
async def backend_set() -> AsyncIterator[BackendSet]:
    backends = BackendSet([])
    yield backends
    backends.close()


async def test_load_configures_and_adds_an_installed_backend(backend_set: BackendSet) -> None:
    backend_set.failed["example"] = "settings refused: earlier"
    await backend_set.load(["example"], {"example": {"resources": {"example.com/thing": 2}}}, 1.5)
    assert list(backend_set.loaded) == ["example"]
    assert backend_set.failed == {}, "a backend that loads is no longer failed"
    example = backend_set.loaded["example"]
    assert example.link.hook_timeout == 1.5
    assert [(r.name, len(r.devices)) for r in await example.discover()] == [("example.com/thing", 2)]


async def test_load_of_no_names_loads_nothing(backend_set: BackendSet) -> None:
    await backend_set.load([], {}, 1.0)
    assert backend_set.loaded == {}
    assert backend_set.failed == {}


async def test_load_keeps_the_given_order(backend_set: BackendSet) -> None:
    await backend_set.load(["broken-conformance", "example"], {}, 1.0)
    assert list(backend_set.loaded) == ["broken-conformance", "example"]


async def test_load_records_refused_settings(backend_set: BackendSet) -> None:
    await backend_set.load(["example"], {"example": {"numa_nodes": 0}}, 1.0)
    assert backend_set.loaded == {}
    assert backend_set.failed == {
        "example": "settings refused: backend 'example' settings do not fit its settings model: "
        "backends.example.numa_nodes: Input should be greater than 0 (got 0)"
    }


async def test_a_backend_whose_settings_load_refuses_is_closed(
    backend_set: BackendSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVICEHOST_EXAMPLE_RESOURCES", "example.com/widget=many")  # its hook refuses
    before = set(worker_threads("example"))
    await backend_set.load(["example"], {}, 1.0)
    assert "example" in backend_set.failed
    assert_threads_exit([t for t in worker_threads("example") if t not in before])


async def test_load_records_backends_that_fail_to_load(backend_set: BackendSet, fake_site: Path) -> None:
    await backend_set.load(["good", "broken", "asyncy"], {}, 1.0)
    assert list(backend_set.loaded) == ["good"]
    assert set(backend_set.failed) == {"broken", "asyncy"}
    assert "import of dh_broken failed (ModuleNotFoundError" in backend_set.failed["broken"]
    assert "hooks must be synchronous" in backend_set.failed["asyncy"]
    assert [s.name for s in backend_set.states()] == ["good", "broken", "asyncy"]


async def test_load_of_an_unknown_name_raises_and_loads_nothing(backend_set: BackendSet) -> None:
    with pytest.raises(
        UnknownBackendError,
        match=r"unknown backend\(s\): ghost \(in enabled_backends\); installed: .*example",
    ):
        await backend_set.load(["example", "ghost"], {}, 1.0)
    assert backend_set.loaded == {}
    assert backend_set.failed == {}
