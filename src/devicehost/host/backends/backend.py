"""One loaded backend: its own pluggy manager, its own threads, typed hook calls with a timeout.

Each backend gets a PluginManager of its own, so a hook call reaches exactly one backend and
the registry never changes while hooks run. Hooks run in the backend's own thread pool with
the caller's contextvars (what ``asyncio.to_thread`` does, but not on the loop's shared pool):
a backend whose hooks hang fills only its own pool and gets ``BackendBusy`` answers, while the
other backends keep their threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pluggy

from devicehost.hookspecs import REQUIRED_HOOKS, rules, spec
from devicehost.hookspecs.types import (
    ContainerAllocation,
    Device,
    Health,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
)

MAX_THREADS_PER_BACKEND = 8


class HookError(Exception):
    """A hook raised, hung, or answered something the contract does not allow."""

    def __init__(self, backend: str, hook: str, problem: str) -> None:
        super().__init__(f"backend {backend!r} {hook} {problem}")
        self.backend = backend
        self.hook = hook


class HookTimeout(HookError):
    """A hook ran past the hook timeout; its thread is left to finish on its own."""


class BackendBusy(HookError):
    """Every thread of the backend is taken by hooks that have not returned."""


class BackendContractError(Exception):
    """The backend object breaks the contract; it is not loaded."""


def hook_implementations(plugin: object) -> dict[str, Any]:
    """The ``@devicehost.hookimpl`` functions of ``plugin``, by hook name."""
    marker = f"{spec.PROJECT_NAME}_impl"
    found = {}
    for name in dir(plugin):
        try:
            value = getattr(plugin, name)
        except Exception:  # a property that raises is not a hook
            continue
        if callable(value) and hasattr(value, marker):
            found[name] = value
    return found


def new_plugin_manager(name: str, plugin: object) -> pluggy.PluginManager:
    """A pluggy manager holding only ``plugin``, checked against the hook specs.

    Raises :class:`pluggy.PluginValidationError` when a hookimpl names no spec or takes
    arguments its spec does not have. The host and the conformance suite both build theirs here.
    """
    manager = pluggy.PluginManager(spec.PROJECT_NAME)
    manager.add_hookspecs(spec)
    manager.register(plugin, name=name)
    manager.check_pending()
    return manager


class Backend:
    """A backend ready to call: ``await backend.allocate(...)`` and friends."""

    def __init__(self, name: str, plugin: object, hook_timeout: float) -> None:
        impls = hook_implementations(plugin)
        asynchronous = sorted(
            n for n, f in impls.items() if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
        )
        if asynchronous:
            raise BackendContractError(
                f"hooks must be synchronous (plain def), these are async: {', '.join(asynchronous)}"
            )
        missing = [hook for hook in REQUIRED_HOOKS if hook not in impls]
        if missing:
            raise BackendContractError(f"does not implement required hook(s): {', '.join(missing)}")
        self.name = name
        self.hook_timeout = hook_timeout
        try:
            self._pm = new_plugin_manager(name, plugin)
        except pluggy.PluginValidationError as exc:
            raise BackendContractError(str(exc)) from exc
        self._implemented = frozenset(impls)
        self._executor = ThreadPoolExecutor(MAX_THREADS_PER_BACKEND, thread_name_prefix=f"backend-{name}")
        self._running: dict[int, tuple[str, float]] = {}
        self._threads = asyncio.Semaphore(MAX_THREADS_PER_BACKEND)
        """Calls wait for a free thread (within their timeout) instead of queueing in the pool."""
        self._call_ids = itertools.count()
        self.failures: Counter[str] = Counter()
        """Hook calls that raised, timed out or were refused as busy, by hook name."""

    @property
    def busy(self) -> bool:
        """Whether hook calls are still running (hung ones included)."""
        return bool(self._running)

    def stuck_hooks(self) -> list[str]:
        """Hooks still running past the hook timeout (their threads never came back)."""
        deadline = time.monotonic() - self.hook_timeout
        return [hook for hook, started in list(self._running.values()) if started < deadline]

    def implements(self, hook: str) -> bool:
        """Whether the backend has an implementation of ``hook``."""
        return hook in self._implemented

    async def _call(self, hook: str, **kwargs: Any) -> Any:
        """Run one hook in the backend's pool, bounded by the hook timeout (waiting for a thread included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hook_timeout
        try:
            if self._threads.locked():  # only then can acquiring wait: bound the wait
                async with asyncio.timeout_at(deadline):
                    await self._threads.acquire()
            else:
                await self._threads.acquire()
        except TimeoutError:
            self.failures[hook] += 1
            raise BackendBusy(
                self.name, hook, f"not called: {len(self._running)} earlier hook calls have not returned"
            ) from None
        caller = getattr(self._pm.hook, hook)
        context = contextvars.copy_context()
        call = functools.partial(context.run, functools.partial(caller, **kwargs))
        call_id = next(self._call_ids)
        self._running[call_id] = (hook, time.monotonic())
        future = loop.run_in_executor(self._executor, call)
        future.add_done_callback(lambda _: self._finished(call_id))
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(future)  # a hung hook's thread runs on; we stop waiting
        except TimeoutError:
            self.failures[hook] += 1
            raise HookTimeout(self.name, hook, f"did not return within {self.hook_timeout:g} s") from None
        except Exception as exc:
            self.failures[hook] += 1
            raise HookError(self.name, hook, f"raised {type(exc).__name__}: {exc}") from exc

    def _finished(self, call_id: int) -> None:
        self._running.pop(call_id, None)
        self._threads.release()

    def refuse(self, hook: str, problem: str) -> HookError:
        """Count and describe an answer that breaks the contract."""
        self.failures[hook] += 1
        return HookError(self.name, hook, problem)

    async def configure(self, settings: Mapping[str, Any]) -> None:
        await self._call("devicehost_configure", settings=settings)

    async def discover(self) -> list[Resource]:
        answer = await self._call("devicehost_discover")
        if answer is None:
            return []
        problem = rules.discovery_problem(answer)
        if problem:
            raise self.refuse("devicehost_discover", problem)
        return list(answer)

    async def health(self, resource: str, devices: tuple[Device, ...]) -> dict[str, Health]:
        answer = await self._call("devicehost_health", resource=resource, devices=devices)
        if answer is None:
            return {}
        if not isinstance(answer, Mapping):
            raise self.refuse("devicehost_health", "must return a mapping of device ID to Health")
        try:
            return {str(k): Health(v) for k, v in answer.items()}
        except ValueError as exc:
            raise self.refuse("devicehost_health", f"returned an invalid health: {exc}") from None

    async def start(self, resource: str, notifier: ResourceNotifier) -> None:
        await self._call("devicehost_start", resource=resource, notifier=notifier)

    async def stop(self, resource: str) -> None:
        await self._call("devicehost_stop", resource=resource)

    async def allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        answer = await self._call("devicehost_allocate", resource=resource, device_ids=device_ids)
        return answer  # type: ignore[no-any-return]  # checked by rules.allocation_problem

    async def preferred_allocation(self, resource: str, request: PreferredAllocationRequest) -> Sequence[str]:
        answer = await self._call("devicehost_preferred_allocation", resource=resource, request=request)
        return answer  # type: ignore[no-any-return]  # checked by rules.preferred_allocation_problem

    async def pre_start_container(self, resource: str, device_ids: tuple[str, ...]) -> None:
        await self._call("devicehost_pre_start_container", resource=resource, device_ids=device_ids)

    def close(self) -> None:
        """Let the backend's threads go; hung ones finish in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)
