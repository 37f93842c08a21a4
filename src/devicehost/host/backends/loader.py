"""Finding and loading backends: stevedore over the ``devicehost.backends`` entry points.

A backend that fails to import, to instantiate or to meet the contract is reported with who
must fix what, and the others load anyway.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from stevedore import ExtensionManager, NamedExtensionManager

from devicehost.hookspecs import ENTRY_POINT_GROUP
from devicehost.host.backends.backend import Backend, BackendContractError

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class BackendStatus:
    """What the host knows about one installed backend, loaded or not."""

    name: str
    target: str
    distribution: str | None
    version: str | None
    backend: Backend | None = None
    error: str | None = None
    disabled: bool = False


class UnknownBackendError(LookupError):
    """The allow-list names backends that are not installed."""


def enabled_backend_names(enabled: Sequence[str], disabled: Sequence[str]) -> list[str]:
    """The installed backends an allow-list (empty: all, by name) and a disable-list leave."""
    installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
    names = [n for n in enabled if n in installed] if enabled else installed
    return [n for n in names if n not in disabled]


def _distribution(entry_point: Any) -> tuple[str | None, str | None]:
    """The distribution and version that ship an entry point's module."""
    module = entry_point.value.split(":")[0].strip()
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top) or []
    if not names:
        return None, None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return names[0], None


def _instantiate(name: str, plugin: object, hook_timeout: float) -> Backend:
    """Classes are instantiated with no arguments; modules and objects are used as they are."""
    obj = plugin() if isinstance(plugin, type) else plugin
    return Backend(name, obj, hook_timeout)


def load_backends(
    enabled: Sequence[str], disabled: Sequence[str], hook_timeout: float
) -> list[BackendStatus]:
    """Load the allowed backends (all installed ones when ``enabled`` is empty), in a fixed order."""
    failures: dict[str, str] = {}

    def on_failure(_manager: object, entry_point: Any, exc: BaseException) -> None:
        failures[entry_point.name] = (
            f"import of {entry_point.value} failed ({type(exc).__name__}: {exc}); "
            "the backend's package is broken: reinstall or upgrade it, or disable the backend"
        )

    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    unknown = sorted(set(enabled) - set(entry_points))
    if unknown:
        installed = ", ".join(sorted(entry_points)) or "none"
        raise UnknownBackendError(f"unknown backend(s): {', '.join(unknown)} (installed: {installed})")
    names = [n for n in enabled if n not in disabled]
    # stevedore keeps one entry-point list per group for the life of the process; drop it so a
    # reload sees what importlib.metadata sees now (a backend installed since the first load).
    ExtensionManager.ENTRY_POINT_CACHE.pop(ENTRY_POINT_GROUP, None)
    manager: ExtensionManager[Any]
    if enabled:
        manager = NamedExtensionManager(
            ENTRY_POINT_GROUP,
            names=names,
            name_order=True,
            on_load_failure_callback=on_failure,
            on_missing_entrypoints_callback=lambda _names: None,  # failed imports: on_failure has them
        )
    else:
        manager = ExtensionManager(ENTRY_POINT_GROUP, on_load_failure_callback=on_failure)

    order = names or sorted(entry_points)
    loaded = {ext.name: ext for ext in manager}
    statuses: list[BackendStatus] = []
    for name in order:
        entry_point = entry_points[name]
        dist, version = _distribution(entry_point)
        if name in disabled:
            statuses.append(BackendStatus(name, entry_point.value, dist, version, disabled=True))
            continue
        error = failures.get(name)
        backend = None
        if error is None:
            try:
                backend = _instantiate(name, loaded[name].plugin, hook_timeout)
            except BackendContractError as exc:
                error = f"breaks the backend contract: {exc}; the backend's author must fix it"
            except Exception as exc:
                error = (
                    f"could not be created ({type(exc).__name__}: {exc}); the backend's author must fix it"
                )
        if error is not None:
            log.error(
                "backend failed to load", backend=name, distribution=dist, version=version, reason=error
            )
        statuses.append(BackendStatus(name, entry_point.value, dist, version, backend=backend, error=error))
    return statuses
