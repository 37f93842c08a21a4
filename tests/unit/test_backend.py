"""Backend._call: the hop into the backend's threads, its timeout, its thread bound, the caller's context."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import eventually

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.backends.backend import (
    Backend,
    BackendBusy,
    HookError,
    HookTimeout,
)
from devicehost.host.backends.threads import MAX_THREADS_PER_BACKEND
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext

pytestmark = pytest.mark.timeout(60)

REQUEST = contextvars.ContextVar("request", default="none")


class Hooks:
    """Allocate answers with the caller's context value, raises, or hangs until released."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.release = threading.Event()
        self.threads: set[str] = set()

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource("example.com/a", (Device("a-0"),))]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        self.threads.add(threading.current_thread().name)
        if self.mode == "timeout-error":
            raise TimeoutError("the device did not answer")
        if self.mode == "hang":
            self.release.wait(30)
        return ContainerAllocation(envs={"REQUEST": REQUEST.get()})


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    hooks = Hooks()
    yield hooks
    hooks.release.set()


async def test_hook_runs_in_a_backend_thread_with_the_callers_context(hooks: Hooks) -> None:
    backend = Backend("ctx", hooks, hook_timeout=5)
    REQUEST.set("req-7")
    answer = await backend.allocate("example.com/a", ("a-0",))
    assert answer.envs == {"REQUEST": "req-7"}
    assert hooks.threads
    assert all(name.startswith("backend-ctx") for name in hooks.threads)
    backend.close()


async def test_hooks_own_timeout_error_is_a_raising_hook_not_a_hung_one(hooks: Hooks) -> None:
    backend = Backend("slowdev", hooks, hook_timeout=5)
    hooks.mode = "timeout-error"
    with pytest.raises(HookError) as raised:
        await backend.allocate("example.com/a", ("a-0",))
    assert not isinstance(raised.value, HookTimeout)
    assert "'slowdev'" in str(raised.value)
    assert "TimeoutError" in str(raised.value)
    backend.close()


async def test_hung_hooks_time_out_and_fill_only_their_own_thread_bound(hooks: Hooks) -> None:
    backend = Backend("hangs", hooks, hook_timeout=0.3)
    hooks.mode = "hang"
    calls = [backend.allocate("example.com/a", ("a-0",)) for _ in range(MAX_THREADS_PER_BACKEND + 1)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert sum(isinstance(o, HookTimeout) for o in outcomes) == MAX_THREADS_PER_BACKEND
    assert sum(isinstance(o, BackendBusy) for o in outcomes) == 1
    assert len(hooks.threads) == MAX_THREADS_PER_BACKEND
    assert len(backend.stuck_hooks()) == MAX_THREADS_PER_BACKEND
    hooks.release.set()
    await eventually(lambda: not backend.busy)
    hooks.mode = "answer"
    assert (await backend.allocate("example.com/a", ("a-0",))).envs == {"REQUEST": "none"}
    backend.close()


async def test_a_cancelled_caller_leaves_the_thread_to_finish_and_frees_it_then(hooks: Hooks) -> None:
    backend = Backend("cancel", hooks, hook_timeout=5)
    hooks.mode = "hang"
    call = asyncio.create_task(backend.allocate("example.com/a", ("a-0",)))
    await eventually(lambda: backend.busy)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert backend.busy
    hooks.release.set()
    await eventually(lambda: not backend.busy)
    backend.close()


class Told:
    """Records the host facts it is told and, at each discovery, the node it knows."""

    def __init__(self) -> None:
        self.told: list[devicehost.HostFacts] = []
        self.discovered_on: list[str] = []
        self.release = threading.Event()
        self.release.set()

    @devicehost.hookimpl
    def devicehost_host_facts(self, facts: devicehost.HostFacts) -> None:
        self.release.wait(5)
        self.told.append(facts)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        self.discovered_on.append(self.told[-1].node_name if self.told else "(none)")
        return []

    @devicehost.hookimpl
    def devicehost_allocate(self) -> ContainerAllocation:
        return ContainerAllocation()


async def test_a_bound_backend_is_told_the_host_facts_before_its_hooks_and_again_when_they_change(
    tmp_path: Path,
) -> None:
    plugin = Told()
    backend = Backend("told", plugin, hook_timeout=5.0)
    try:
        await backend.discover()
        assert plugin.told == []  # no host: nothing to tell
        context = HostContext(HostConfig(node_name="n1", cdi_dir=tmp_path / "a"))
        backend.link.bind(context)
        plugin.release.clear()  # calls made together wait for the one telling
        calls = [asyncio.create_task(backend.discover()) for _ in range(3)]
        await asyncio.sleep(0.05)
        plugin.release.set()
        await asyncio.gather(*calls)
        await backend.discover()
        assert plugin.told == [devicehost.HostFacts(node_name="n1", cdi_dir=tmp_path / "a")]
        assert plugin.discovered_on == ["(none)"] + ["n1"] * 4
        context.config = context.config.model_copy(update={"cdi_dir": tmp_path / "b"})  # a reload
        await backend.discover()
        assert [f.cdi_dir for f in plugin.told] == [tmp_path / "a", tmp_path / "b"]
    finally:
        backend.close()


async def test_a_backend_without_the_facts_hook_keeps_working(hooks: Hooks, tmp_path: Path) -> None:
    backend = Backend("plain", hooks, hook_timeout=5.0)
    try:
        backend.link.bind(HostContext(HostConfig(cdi_dir=tmp_path)))
        assert backend.link.facts == devicehost.HostFacts(node_name="", cdi_dir=tmp_path)
        assert await backend.discover() is not None
    finally:
        backend.close()
