"""Finding and loading backends: stevedore over the ``devicehost.backends`` entry points.

A backend that fails to import, to instantiate or to meet the contract is reported with who
must fix what, and the others load anyway.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from stevedore import ExtensionManager, NamedExtensionManager

from devicehost.hookspecs import ENTRY_POINT_GROUP
from devicehost.host.backends.backend import Backend, BackendContractError
from devicehost.host.config import HostConfig, nearest

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
    plugin: object | None = None
    """The backend object behind the entry point (also when the contract refused it)."""


class UnknownBackendError(LookupError):
    """The allow-list names backends that are not installed."""


def unknown_names_problem(named: Mapping[str, Iterable[str]], installed: Sequence[str]) -> str | None:
    """Why the backend names given are wrong (None when every one is installed).

    :param named: the names by where they were given (``enabled_backends``, ``disabled_backends``,
        ``backends``); ``--backend``, ``--disable``, the environment and the file all end up there.
    """
    unknown = {name: where for where, names in named.items() for name in names if name not in installed}
    if not unknown:
        return None
    described = []
    for name, where in unknown.items():
        guess = nearest(name, installed)
        described.append(f"{name} (in {where}{f', did you mean {guess!r}?' if guess else ''})")
    return f"unknown backend(s): {'; '.join(described)}; installed: {', '.join(installed) or 'none'}"


def check_names(config: HostConfig) -> None:
    """Every backend the config names is installed.

    :raises UnknownBackendError: naming each unknown one, where it was named, and what is installed.
    """
    named = {
        "enabled_backends": config.enabled_backends,
        "disabled_backends": config.disabled_backends,
        "backends": tuple(config.backends),
    }
    problem = unknown_names_problem(named, installed_backend_names())
    if problem:
        raise UnknownBackendError(problem)


def installed_backend_names() -> list[str]:
    """The entry-point names of every installed backend, sorted."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def enabled_names(enabled: Sequence[str], disabled: Sequence[str], installed: Sequence[str]) -> list[str]:
    """The installed backends an allow-list (empty: all, by name) and a disable-list leave."""
    names = [n for n in enabled if n in installed] if enabled else list(installed)
    return [n for n in names if n not in disabled]


def enabled_backend_names(enabled: Sequence[str], disabled: Sequence[str]) -> list[str]:
    """:func:`enabled_names` over the backends installed now."""
    return enabled_names(enabled, disabled, installed_backend_names())


def _distribution(entry_point: Any) -> tuple[str | None, str | None]:
    """The distribution that declares an entry point, and its version.

    Read from the entry point itself: mapping modules to distributions would read every installed
    package's file list, on the way to the first registration.
    """
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.name, dist.version


def _extensions(enabled: Sequence[str], names: Sequence[str], failures: dict[str, str]) -> dict[str, Any]:
    """Import the backends through stevedore; import failures land in ``failures``."""

    def on_failure(_manager: object, entry_point: Any, exc: BaseException) -> None:
        failures[entry_point.name] = (
            f"import of {entry_point.value} failed ({type(exc).__name__}: {exc}); "
            "the backend's package is broken: reinstall or upgrade it, or disable the backend"
        )

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
    return {ext.name: ext.plugin for ext in manager}


def _load_one(
    name: str, target: Any, entry_point: Any, error: str | None, hook_timeout: float
) -> BackendStatus:
    """Instantiate one imported backend (classes with no arguments) and wrap it in a Backend."""
    dist, version = _distribution(entry_point)
    plugin = backend = None
    if error is None:
        try:
            plugin = target() if isinstance(target, type) else target
            backend = Backend(name, plugin, hook_timeout)
            backend.distribution, backend.version = dist, version
        except BackendContractError as exc:
            error = f"breaks the backend contract: {exc}; the backend's author must fix it"
        except Exception as exc:
            error = f"could not be created ({type(exc).__name__}: {exc}); the backend's author must fix it"
    if error is not None:
        log.error("backend failed to load", backend=name, distribution=dist, version=version, reason=error)
    return BackendStatus(name, entry_point.value, dist, version, backend=backend, error=error, plugin=plugin)


def load_backends(
    enabled: Sequence[str], disabled: Sequence[str], hook_timeout: float
) -> list[BackendStatus]:
    """Load the allowed backends (all installed ones when ``enabled`` is empty), in a fixed order."""
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    problem = unknown_names_problem(
        {"enabled_backends": enabled, "disabled_backends": disabled}, sorted(entry_points)
    )
    if problem:
        raise UnknownBackendError(problem)
    names = [n for n in enabled if n not in disabled]
    failures: dict[str, str] = {}
    targets = _extensions(enabled, names, failures)
    statuses: list[BackendStatus] = []
    for name in names or sorted(entry_points):
        entry_point = entry_points[name]
        if name in disabled:
            dist, version = _distribution(entry_point)
            statuses.append(BackendStatus(name, entry_point.value, dist, version, disabled=True))
            continue
        statuses.append(_load_one(name, targets.get(name), entry_point, failures.get(name), hook_timeout))
    return statuses
