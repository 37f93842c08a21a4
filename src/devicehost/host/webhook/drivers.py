"""Which loaded backend answers for which DRA driver: the backends loaded, configured and
discovered once, as the host would, plus the drivers the operator names (``--driver``).

A resource counts when the host would serve it through DRA (``serve_through`` ``dra`` or
``both``, as :mod:`devicehost.host.dra.drivers` decides); its driver is
:func:`~devicehost.host.dra.names.driver_name` of it. A backend whose discovery fails or finds
nothing (a webhook pod without its hardware) answers only for the drivers named for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from devicehost.hookspecs.types import Resource
from devicehost.host.backends.backend import Backend, HookError, SettingsRefused
from devicehost.host.backends.loader import load_backends
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.dra.drivers import served_through
from devicehost.host.dra.names import driver_name

log = structlog.get_logger(__name__)


@dataclass
class DriverTable:
    """Driver name -> the backend that checks its claim configuration."""

    backends: dict[str, Backend] = field(default_factory=dict)
    loaded: tuple[Backend, ...] = ()
    problems: tuple[str, ...] = ()
    """What went wrong while building it (a backend that failed, a driver claimed twice)."""

    def close(self) -> None:
        for backend in self.loaded:
            backend.close()

    def describe(self) -> dict[str, str]:
        """Driver -> backend name, and whether the backend has a claim configuration model."""
        return {
            driver: backend.name + ("" if backend.claim_config_model else " (no model: any parameters)")
            for driver, backend in sorted(self.backends.items())
        }


def served_through_dra(resource: Resource, backend: str, config: HostConfig) -> bool:
    """The host serves the resource through DRA (``dra`` or ``both``: the host's own rule,
    :func:`~devicehost.host.dra.drivers.served_through`)."""
    return served_through(config.serve_through, backend, resource) in ("dra", "both")


def parse_named_drivers(given: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``BACKEND=DRIVER`` words (``--driver``) as backend -> drivers.

    :raises ValueError: a word without ``=`` or with an empty side.
    """
    named: dict[str, list[str]] = {}
    for word in given:
        backend, sep, driver = word.partition("=")
        if not sep or not backend.strip() or not driver.strip():
            raise ValueError(
                f"--driver {word!r}: expected BACKEND=DRIVER, such as dra-example=gpu.example.com"
            )
        named.setdefault(backend.strip(), []).append(driver.strip())
    return {backend: tuple(drivers) for backend, drivers in named.items()}


async def _discovered(backend: Backend, config: HostConfig) -> Sequence[Resource]:
    """The backend configured as the host would, then its resources; none when discovery fails.

    :raises HookError: the backend's settings are refused, or its configure hook fails.
    """
    try:
        await backend.configure(config.backends.get(backend.name, {}))
    except SettingsRefused as exc:
        log.error("backend settings refused", backend=backend.name, problems=list(exc.problems))
        raise
    except HookError as exc:
        log.error("backend could not be configured", backend=backend.name, error=str(exc))
        raise
    try:
        return await backend.discover()
    except HookError as exc:
        log.warning(
            "discovery failed; the backend checks only the drivers named for it (--driver)",
            backend=backend.name,
            error=str(exc),
        )
        return ()


async def build_table(config: HostConfig, named: Mapping[str, Sequence[str]]) -> DriverTable:
    """Load the backends the config allows, discover each once, map drivers to backends."""
    statuses = await asyncio.to_thread(
        load_backends, config.enabled_backends, config.disabled_backends, config.hook_timeout
    )
    loaded = [s.backend for s in statuses if s.backend is not None]
    problems = [f"backend {s.name}: {s.error}" for s in statuses if s.error is not None]
    unknown = sorted(set(named) - {b.name for b in loaded})
    problems += [f"--driver names backend {name}, which is not loaded" for name in unknown]
    table = DriverTable(loaded=tuple(loaded))
    context = HostContext(config)
    for backend in loaded:
        backend.link.bind(context)  # told the node and cdi_dir as the host tells them
        try:
            resources = await _discovered(backend, config)
        except SettingsRefused as exc:
            problems.append(f"backend {backend.name}: settings refused: {'; '.join(exc.problems)}")
            continue
        except HookError as exc:
            problems.append(f"backend {backend.name}: {exc}")
            continue
        drivers = [
            driver_name(r.name, config.dra_drivers)
            for r in resources
            if served_through_dra(r, backend.name, config)
        ]
        for driver in dict.fromkeys([*drivers, *named.get(backend.name, ())]):
            owner = table.backends.setdefault(driver, backend)
            if owner is not backend:
                problems.append(
                    f"driver {driver} belongs to backends {owner.name} and {backend.name}; {owner.name} checks it"
                )
    table.problems = tuple(problems)
    for problem in problems:
        log.error("webhook backend problem", problem=problem)
    log.info("drivers checked", drivers=table.describe())
    return table
