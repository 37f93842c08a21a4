"""Backend._call: the hop into the backend's threads, its timeout, its thread bound, the caller's context."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator

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
