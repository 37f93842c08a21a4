"""``devicehost backends``: list installed backends, their status and what each discovers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from devicehost.host.cli.common import EXIT_OK, add_config_options, load_backend_statuses, set_handler

if TYPE_CHECKING:
    from devicehost.host.backends.backend import Backend
    from devicehost.host.backends.loader import BackendStatus
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig


def add_parser(commands: Commands) -> None:
    backends = commands.add_parser("backends", help="list installed backends, their status and resources")
    add_config_options(backends)
    set_handler(backends, backends_command)


def backends_command(args: argparse.Namespace, config: HostConfig) -> int:
    """One line per installed backend, then the resources of each loaded one."""
    import asyncio

    from devicehost.host.logs import configure_logging

    configure_logging("error", config.log_format, sys.stderr)
    statuses = load_backend_statuses(config)
    if not statuses:
        print("no backends installed (entry point group devicehost.backends)")
        return EXIT_OK
    for status in statuses:
        print(describe(status))
        if status.backend is not None:
            print(asyncio.run(discover(status.backend, config)))
            status.backend.close()
    return EXIT_OK


def describe(status: BackendStatus) -> str:
    """``NAME  (DISTRIBUTION VERSION, TARGET)  STATE``."""
    where = f"{status.distribution or '?'} {status.version or '?'}"
    if status.disabled:
        state = "disabled"
    elif status.error:
        state = f"FAILED: {status.error}"
    else:
        state = "loaded"
    return f"{status.name}  ({where}, {status.target})  {state}"


async def discover(backend: Backend, config: HostConfig) -> str:
    """The backend's resources, one indented line each, after configuring it as the host would."""
    from devicehost.host.backends.backend import HookError, SettingsRefused

    try:
        await backend.configure(config.backends.get(backend.name, {}))
        resources = await backend.discover()
    except SettingsRefused as exc:
        return "\n".join(f"    settings refused: {problem}" for problem in exc.problems)
    except HookError as exc:
        return f"    discovery failed: {exc}"
    if not resources:
        return "    no resources"
    return "\n".join(
        f"    {r.name}: {len(r.devices)} devices ({sum(d.health == 'Healthy' for d in r.devices)} healthy)"
        for r in resources
    )
