"""The backends one host runs: loaded and configured ones, and the failed ones with the reason."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from devicehost.hookspecs.types import Resource
from devicehost.host.backends.backend import Backend, HookError, SettingsRefused
from devicehost.host.backends.loader import load_backends
from devicehost.host.state import BackendState

if TYPE_CHECKING:
    from devicehost.host.context import HostContext

log = structlog.get_logger(__name__)

Settings = Mapping[str, Mapping[str, Any]]
"""Per-backend settings, by backend name (the config's ``backends`` key)."""


async def refused_settings(backends: Sequence[Backend], settings: Settings) -> dict[str, str]:
    """A dry run of each backend's settings (its model, then its configure hook): refusals by name.

    Nothing is served; ``devicehost config check`` and ``devicehost run`` (before it serves) use it.
    """
    refused: dict[str, str] = {}
    for backend in backends:
        try:
            await backend.configure(settings.get(backend.name, {}))
        except SettingsRefused as exc:
            refused[backend.name] = "\n".join(exc.problems)
        except HookError as exc:
            refused[backend.name] = f"backends.{backend.name}: {exc}"
    return refused


class BackendSet:
    """Backends by name; one whose settings are refused moves to :attr:`failed`."""

    def __init__(
        self,
        loaded: Sequence[Backend],
        failed: Mapping[str, str] | None = None,
        context: HostContext | None = None,
    ) -> None:
        self.loaded = {b.name: b for b in loaded}
        self.context = context
        """The host's context, which every backend is bound to (hook timeout, host facts); None:
        each keeps the hook timeout it was loaded with, and is told no facts."""
        for backend in loaded:
            self._bind(backend)
        self.failed: dict[str, str] = dict(failed or {})
        """Backends that did not load or whose settings were refused, with the reason."""
        self._announced: weakref.WeakSet[Backend] = weakref.WeakSet()
        self.discovery_errors: dict[str, str] = {}
        """Loaded backends whose last discovery failed, with the error (cleared by a success)."""
        self.refused: dict[str, dict[str, str]] = {}
        """Resources the host refused at each backend's last discovery: the problem, by name."""

    def __iter__(self) -> Iterator[Backend]:
        return iter(list(self.loaded.values()))

    async def configure_all(self, settings: Settings) -> None:
        """Hand every backend its settings; drop those that refuse them."""
        for backend in list(self):
            if not await self._configure(backend, settings.get(backend.name, {})):
                del self.loaded[backend.name]
                backend.close()

    def _announce(self, backend: Backend, answer: Sequence[Resource] | None) -> None:
        """One line per backend, at its first discovery: where it came from, what it offers."""
        if backend not in self._announced:
            self._announced.add(backend)
            log.info(
                "backend loaded",
                backend=backend.name,
                distribution=backend.distribution,
                version=backend.version,
                resources=sorted(r.name for r in answer or ()),
            )

    async def reconfigure(self, name: str, settings: Mapping[str, Any]) -> str | None:
        """New settings for a loaded backend; one that refuses them keeps its previous ones.

        :returns: why they were refused; None when they were taken.
        """
        try:
            await self.loaded[name].configure(settings)
        except HookError as exc:
            log.error(
                "new settings refused, the backend keeps its previous ones", backend=name, error=str(exc)
            )
            return str(exc)
        return None

    async def load(self, names: Sequence[str], settings: Settings, hook_timeout: float) -> None:
        """Load and configure more backends (in a thread: imports can be slow); none named, none loaded."""
        if not names:
            return  # load_backends reads an empty list as "every installed backend"
        for status in await asyncio.to_thread(load_backends, names, [], hook_timeout):
            if status.backend is None:
                self.failed[status.name] = status.error or "failed to load"
                continue
            self.failed.pop(status.name, None)
            self._bind(status.backend)
            if await self._configure(status.backend, settings.get(status.name, {})):
                self.loaded[status.name] = status.backend
                log.info("backend enabled", backend=status.name)
            else:
                status.backend.close()

    async def disable(self, name: str, withdraw: Callable[[Backend], Awaitable[None]]) -> None:
        """Take out a backend that is no longer enabled, ``withdraw`` its resources, and close it."""
        backend = self.loaded.pop(name)
        self.discovery_errors.pop(name, None)
        self.refused.pop(name, None)
        await withdraw(backend)
        backend.close()
        log.info("backend disabled", backend=name)

    def note_refused(self, name: str, refused: Mapping[str, str]) -> dict[str, str]:
        """Record the resources refused at ``name``'s discovery; those refused anew (to log)."""
        before = self.refused.get(name, {})
        self.refused[name] = dict(refused)
        return {resource: problem for resource, problem in refused.items() if before.get(resource) != problem}

    def _bind(self, backend: Backend) -> None:
        if self.context is not None:
            backend.link.bind(self.context)

    def close(self) -> None:
        for backend in self:
            backend.close()

    def states(self) -> tuple[BackendState, ...]:
        loaded = tuple(
            BackendState(
                b.name,
                True,
                stuck_hooks=tuple(b.stuck_hooks()),
                hook_failures=dict(b.failures),
                discovery_error=self.discovery_errors.get(b.name, ""),
                refused=dict(self.refused.get(b.name, {})),
            )
            for b in self
        )
        return loaded + tuple(BackendState(name, False, reason) for name, reason in self.failed.items())

    async def discover(self, backend: Backend) -> Sequence[Resource] | None:
        """One discovery of ``backend``; None when it failed (logged)."""
        try:
            answer = await backend.discover()
        except HookError as exc:
            if self.discovery_errors.get(backend.name) != str(exc):  # once per change, not per round
                log.error(
                    "discovery failed, keeping this backend's resources as they are",
                    backend=backend.name,
                    error=str(exc),
                )
            self.discovery_errors[backend.name] = str(exc)
            answer = None
        else:
            if self.discovery_errors.pop(backend.name, None) is not None:
                log.info("discovery works again", backend=backend.name)
        self._announce(backend, answer)
        return answer

    async def _configure(self, backend: Backend, settings: Mapping[str, Any]) -> bool:
        try:
            await backend.configure(settings)
        except HookError as exc:
            log.error("backend settings refused", backend=backend.name, error=str(exc))
            self.failed[backend.name] = f"settings refused: {exc}"
            return False
        return True
