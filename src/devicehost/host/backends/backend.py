"""One loaded backend: its own pluggy manager, its own threads, typed hook calls with a timeout.

Each backend gets a PluginManager of its own, so a hook call reaches exactly one backend and
the registry never changes while hooks run. Hooks run in the backend's own thread pool with
the caller's contextvars (what ``asyncio.to_thread`` does, but not on the loop's shared pool):
a backend whose hooks hang fills only its own pool and gets ``BackendBusy`` answers, while the
other backends keep their threads.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy
import structlog
from pydantic import BaseModel, ValidationError

from devicehost import cdi
from devicehost.hookspecs import REQUIRED_HOOKS, rules, spec
from devicehost.hookspecs.types import (
    ClaimRequest,
    ContainerAllocation,
    Device,
    DeviceStatus,
    Health,
    HostFacts,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
)
from devicehost.host.backends.threads import Closed, Expired, HookThreads, NoThread
from devicehost.host.config import describe_errors, model_keys, unknown_key

if TYPE_CHECKING:
    from devicehost.host.context import HostContext

log = structlog.get_logger(__name__)


class HookError(Exception):
    """A hook raised, hung, or answered something the contract does not allow."""

    def __init__(self, backend: str, hook: str, problem: str) -> None:
        super().__init__(f"backend {backend!r} {hook} {problem}")
        self.backend = backend
        self.hook = hook


class HookTimeout(HookError):
    """A hook ran past the hook timeout; its thread is left to finish on its own."""


class AnswerRefused(HookError):
    """A hook answered something the contract does not allow."""


class BackendBusy(HookError):
    """Every thread of the backend is taken by hooks that have not returned."""


class SettingsRefused(HookError):
    """The backend's settings model refused its settings; ``problems`` are ``key.path: why`` lines."""

    def __init__(self, backend: str, problems: Sequence[str]) -> None:
        super().__init__(backend, "settings", "do not fit its settings model: " + "; ".join(problems))
        self.problems = tuple(problems)


class ClaimConfigRefused(HookError):
    """The backend's claim configuration model refused a claim's parameters."""

    def __init__(self, backend: str, problems: Sequence[str]) -> None:
        super().__init__(backend, "claim configuration", "refused: " + "; ".join(problems))
        self.problems = tuple(problems)


DECLARED = {"devicehost_allocate": "allocate", "devicehost_release": "release", "devicehost_health": "health"}
"""The hooks whose seconds a resource may declare (:class:`HookTimeouts`), by their field."""


class BackendContractError(Exception):
    """The backend object breaks the contract; it is not loaded."""


def _checked_implementations(plugin: object) -> dict[str, Any]:
    """:func:`hook_implementations`, all synchronous and the required ones there, or BackendContractError."""
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
    return impls


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


def declared_model(
    manager: pluggy.PluginManager, hook: str, implemented: Collection[str]
) -> type[BaseModel] | None:
    """What the backend's model hook (``devicehost_settings_model``, ``devicehost_claim_config_model``)
    returns, checked to be a pydantic model; None when it does not implement the hook."""
    if hook not in implemented:
        return None
    try:
        model = getattr(manager.hook, hook)()
    except Exception as exc:
        raise BackendContractError(f"{hook} raised {type(exc).__name__}: {exc}") from exc
    if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise BackendContractError(f"{hook} must return a pydantic model class, not {model!r}")
    return model


def checked_settings(
    name: str, model: type[BaseModel] | None, settings: Mapping[str, Any]
) -> Mapping[str, Any] | BaseModel:
    """``settings`` validated by ``model``; unknown top-level keys refused even if it allows extras.

    :raises SettingsRefused: naming each bad key as ``backends.<name>.<key path>``.
    """
    if model is None:
        return settings
    value, problems = validated(model, settings, ("backends", name))
    if problems or value is None:
        raise SettingsRefused(name, problems)
    return value


def validated(
    model: type[BaseModel], values: Mapping[str, Any], prefix: tuple[str, ...]
) -> tuple[BaseModel | None, list[str]]:
    """``values`` as a ``model`` instance, or the ``key.path: why`` problems (prefixed with ``prefix``);
    unknown top-level keys are refused even when the model allows extras."""
    problems = []
    if model.model_config.get("extra") != "forbid":
        accepted = model_keys(model)
        problems = [
            f"{'.'.join((*prefix, str(k)))}: {unknown_key(str(k), accepted)}"
            for k in values
            if k not in accepted
        ]
    try:
        return model.model_validate(values), problems
    except ValidationError as exc:
        return None, problems + describe_errors(exc, model, prefix)


FACTS_HOOK = "devicehost_host_facts"


class HostLink:
    """What ties a backend to the host that serves it: the host's context, read at each hook call
    (the hook timeout, the facts), and the facts the backend was last told."""

    def __init__(self, hook_timeout: float) -> None:
        self._hook_timeout = hook_timeout
        self._context: HostContext | None = None
        self.told: HostFacts | None = None
        """The facts the backend was last told (``devicehost_host_facts``)."""
        self._telling: tuple[HostFacts, asyncio.Future[None]] | None = None

    def bind(self, context: HostContext) -> None:
        """Serve ``context``'s host: from now on each hook call reads the hook timeout and the host
        facts there, when it is made (a reload reaches the next call)."""
        self._context = context

    @property
    def hook_timeout(self) -> float:
        """Seconds a hook may run: the host's live ``hook_timeout`` once bound."""
        return self._hook_timeout if self._context is None else self._context.config.hook_timeout

    @property
    def facts(self) -> HostFacts | None:
        """What the backend is told of its host (None: no host, as in a backend's own tests)."""
        return None if self._context is None else self._context.facts()

    async def ready(
        self, caller: Callable[..., Any], tell: Callable[..., Awaitable[Any]] | None
    ) -> Callable[..., Any]:
        """``caller`` to run with the host's ``cdi_dir`` as ``devicehost.cdi``'s default dir, once
        ``tell`` told the facts if they changed since last told (hook calls made meanwhile wait for
        that one telling); as it is without a host."""
        facts = self.facts
        if facts is None:
            return caller
        while tell is not None and facts is not self.told and facts != self.told:
            pending = self._telling
            if pending is None or pending[1].done():
                pending = self._telling = (facts, asyncio.ensure_future(self._tell(facts, tell)))
            await asyncio.shield(pending[1])  # a hook call cancelled leaves the telling to the others
        return functools.partial(cdi.call_in_dir, facts.cdi_dir, caller)

    async def _tell(self, facts: HostFacts, tell: Callable[..., Awaitable[Any]]) -> None:
        await tell(facts=facts)
        self.told = facts


class Backend:
    """A backend ready to call: ``await backend.allocate(...)`` and friends."""

    def __init__(self, name: str, plugin: object, hook_timeout: float) -> None:
        impls = _checked_implementations(plugin)
        self.name = name
        self.link = HostLink(hook_timeout)
        self.distribution: str | None = None
        """The distribution that installed the backend, and its version (set by the loader)."""
        self.version: str | None = None
        try:
            self._pm = new_plugin_manager(name, plugin)
        except pluggy.PluginValidationError as exc:
            raise BackendContractError(str(exc)) from exc
        self._implemented = frozenset(impls)
        self.settings_model = declared_model(self._pm, "devicehost_settings_model", impls)
        """The pydantic model the backend declared for its settings, or None (a plain mapping)."""
        self.claim_config_model = declared_model(self._pm, "devicehost_claim_config_model", impls)
        """The pydantic model of the DRA claim configuration it takes, or None (a plain mapping)."""
        self._threads = HookThreads(name)
        self.failures: Counter[str] = Counter()
        """Hook calls that raised, timed out or were refused as busy, by hook name."""

    def validated_settings(self, settings: Mapping[str, Any]) -> Mapping[str, Any] | BaseModel:
        """``settings`` checked by the backend's settings model (as is without one).

        :raises SettingsRefused: naming each bad key as ``backends.<name>.<key path>``.
        """
        return checked_settings(self.name, self.settings_model, settings)

    def claim_config(self, parameters: Mapping[str, Any], where: str) -> Mapping[str, Any] | BaseModel:
        """A claim's opaque ``parameters`` checked by the backend's claim configuration model.

        :raises ClaimConfigRefused: naming each bad key as ``<where>.<key path>``.
        """
        if self.claim_config_model is None:
            return parameters
        try:
            value, problems = validated(self.claim_config_model, parameters, (where,))
        except Exception as exc:  # a validator that breaks: that claim fails, not the kubelet's call
            self.failures["devicehost_claim_config_model"] += 1
            problems, value = [f"{where}: the model's validation raised {type(exc).__name__}: {exc}"], None
        if problems or value is None:
            raise ClaimConfigRefused(self.name, problems)
        return value

    @property
    def busy(self) -> bool:
        """Whether hook calls are still running (hung ones included)."""
        return bool(self._threads.running)

    def stuck_hooks(self) -> list[str]:
        """Hooks still running past their bound (their threads never came back)."""
        return self._threads.stuck()

    def implements(self, hook: str) -> bool:
        """Whether the backend has an implementation of ``hook``."""
        return hook in self._implemented

    async def _call(self, hook: str, **kwargs: Any) -> Any:
        """Run one hook in the backend's threads within the hook timeout, facts told first (:class:`HostLink`)."""
        tell = functools.partial(self._call, FACTS_HOOK) if FACTS_HOOK in self._implemented else None
        caller = await self.link.ready(getattr(self._pm.hook, hook), None if hook == FACTS_HOOK else tell)
        try:
            return await self._threads.call(hook, caller, kwargs, self.link.hook_timeout)
        except NoThread as exc:
            self.failures[hook] += 1
            raise BackendBusy(self.name, hook, str(exc)) from None
        except Closed as exc:
            raise HookError(self.name, hook, str(exc)) from None
        except Expired as exc:
            self.failures[hook] += 1
            raise HookTimeout(self.name, hook, f"did not return within {exc}") from None
        except Exception as exc:
            self.failures[hook] += 1
            # The traceback for whoever debugs the backend (callers log the one-line text only).
            log.debug("hook raised", backend=self.name, hook=hook, exc_info=exc)
            raise HookError(self.name, hook, f"raised {type(exc).__name__}: {exc}") from exc

    def refuse(self, hook: str, problem: str) -> AnswerRefused:
        """Count and describe an answer that breaks the contract."""
        self.failures[hook] += 1
        return AnswerRefused(self.name, hook, problem)

    async def configure(self, settings: Mapping[str, Any]) -> None:
        """Check ``settings`` with the backend's model, then hand them to its configure hook."""
        checked = self.validated_settings(settings)
        if self.implements("devicehost_configure"):
            await self._call("devicehost_configure", settings=checked)

    async def discover(self) -> list[Resource]:
        answer = await self._call("devicehost_discover")
        if answer is None:
            return []
        problem = rules.discovery_problem(answer) or self._binding_hook_problem(answer)
        if problem:
            raise self.refuse("devicehost_discover", problem)
        self._threads.bounds = declared_bounds(answer)
        return list(answer)

    async def health(self, resource: str, devices: tuple[Device, ...]) -> dict[str, Health]:
        answer = await self._call("devicehost_health", resource=resource, devices=devices)
        if answer is None:
            return {}
        problem = rules.health_problem(answer)
        if problem:
            raise self.refuse("devicehost_health", f"answer refused: {problem}")
        return dict(answer)

    async def start(self, resource: str, notifier: ResourceNotifier) -> None:
        await self._call("devicehost_start", resource=resource, notifier=notifier)

    async def stop(self, resource: str) -> None:
        await self._call("devicehost_stop", resource=resource)

    async def allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None = None
    ) -> ContainerAllocation:
        answer = await self._call(
            "devicehost_allocate", resource=resource, device_ids=device_ids, claim=claim
        )
        problem = rules.allocation_problem(answer)
        if problem:
            raise self.refuse("devicehost_allocate", problem)
        return answer  # type: ignore[no-any-return]  # checked by rules.allocation_problem

    async def preferred_allocation(self, resource: str, request: PreferredAllocationRequest) -> Sequence[str]:
        answer = await self._call("devicehost_preferred_allocation", resource=resource, request=request)
        problem = rules.preferred_allocation_problem(
            answer, request.available, request.must_include, request.size
        )
        if problem:
            raise self.refuse("devicehost_preferred_allocation", problem)
        return answer  # type: ignore[no-any-return]  # checked by rules.preferred_allocation_problem

    async def pre_start_container(self, resource: str, device_ids: tuple[str, ...]) -> None:
        await self._call("devicehost_pre_start_container", resource=resource, device_ids=device_ids)

    async def release(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None = None
    ) -> None:
        await self._call("devicehost_release", resource=resource, device_ids=device_ids, claim=claim)

    async def restore(self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest) -> None:
        """Tell the backend of a claim prepared before the host started (DRA; its optional hook)."""
        if self.implements("devicehost_restore"):
            await self._call("devicehost_restore", resource=resource, device_ids=device_ids, claim=claim)

    async def device_status(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
    ) -> dict[str, DeviceStatus]:
        """The backend's ``devicehost_device_status`` answer, checked (empty when it answers None)."""
        hook = "devicehost_device_status"
        answer = await self._call(
            hook, resource=resource, device_ids=device_ids, claim=claim, prepared=prepared
        )
        if answer is None:
            return {}
        problem = rules.device_status_problem(answer, device_ids)
        if problem:
            raise self.refuse(hook, problem)
        return dict(answer)

    def _binding_hook_problem(self, resources: Sequence[Resource]) -> str | None:
        """Binding conditions are reported through the device status hook: without it, no pod that
        got such a device would ever bind."""
        if self.implements("devicehost_device_status"):
            return None
        bound = [d.id for r in resources for d in r.devices if d.binding_conditions]
        if not bound:
            return None
        return f"device {bound[0]!r} has binding_conditions, but devicehost_device_status is not implemented"

    def resource_timeouts(self, resource: str) -> dict[str, float]:
        """The seconds each hook whose bound a resource may declare may take for ``resource``: its
        own, else the host's hook timeout."""
        bounds = self._threads.bounds
        return {
            field: bounds.get((hook, resource), self.link.hook_timeout) for hook, field in DECLARED.items()
        }

    def close(self) -> None:
        """Let the backend's threads go; hung ones finish in the background."""
        self._threads.close()


def declared_bounds(resources: Sequence[Resource]) -> dict[tuple[str, str], float]:
    """The seconds the resources declared for their hooks (:class:`HookTimeouts`), by (hook, resource)."""
    declared = (
        (hook, r.name, getattr(r.hook_timeouts, field)) for r in resources for hook, field in DECLARED.items()
    )
    return {(hook, name): float(seconds) for hook, name, seconds in declared if seconds is not None}
