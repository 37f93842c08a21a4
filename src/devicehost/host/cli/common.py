"""What every ``devicehost`` command shares: exit codes, the config flags, backend loading, errors.

Nothing heavy is imported at module level (the config model, stevedore and the backends load
inside the functions), so ``devicehost --help`` stays quick.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from devicehost.host.backends.backend import Backend
    from devicehost.host.backends.loader import BackendStatus
    from devicehost.host.config import HostConfig

    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    """The ``add_subparsers`` action each command module adds its parser to."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace, "HostConfig"], int]
"""A command: the parsed arguments and the configuration in, the exit status out."""
ConfigLoader = Callable[[argparse.Namespace], "HostConfig"]
"""How a command builds its configuration from the parsed arguments."""


class Parser(argparse.ArgumentParser):
    """Every ``devicehost`` parser: no abbreviated flags (``--metrics-addres`` is a typo, not a flag)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


class CommandFailed(Exception):
    """A command cannot go on; ``main`` prints ``devicehost: <message>`` and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class BackendLoadFailed(CommandFailed):
    """The backends named cannot be loaded (unknown names), or none of them could."""


def set_handler(
    parser: argparse.ArgumentParser, handler: Handler, load_config: ConfigLoader | None = None
) -> None:
    """Make ``parser``'s command run ``handler`` on the config ``load_config`` builds (flags, env, file)."""
    parser.set_defaults(handler=handler, load_config=load_config or config_from_args, command_parser=parser)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and one flag per config key, generated from the config model."""
    from devicehost.host.config import ENV_CONFIG, settings

    parser.add_argument("--config", type=Path, metavar="FILE", help=f"YAML config file (env {ENV_CONFIG})")
    for setting in settings():
        where = f"config key {setting.key}, env {setting.env}"
        options: dict[str, Any] = {"dest": setting.key, "help": f"{setting.description} ({where})"}
        if setting.shape == "switch":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["metavar"] = setting.metavar
        if setting.shape == "list":
            options["action"] = "append"
            options["help"] = f"{setting.description}; repeatable, or a,b ({where})"
        if setting.choices:
            options["choices"] = setting.choices
            del options["metavar"]
        parser.add_argument(setting.flag, **options)


def config_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line gives, parsed as the environment's are; absent flags left out."""
    from devicehost.host.config import settings

    values: dict[str, Any] = {}
    for setting in settings():
        given = getattr(args, setting.key, None)
        if given is None:
            continue
        if setting.shape == "list":
            values[setting.key] = [name for text in given for name in setting.parse(text)]
        elif setting.shape == "switch":
            values[setting.key] = given
        else:
            values[setting.key] = setting.parse(given)
    return values


def config_from_args(args: argparse.Namespace) -> HostConfig:
    """Defaults < the config file (``--config`` or $DEVICEHOST_CONFIG) < environment < flags."""
    from devicehost.host.config import build_config

    return build_config(getattr(args, "config", None), config_values(args))


def checked_config(args: argparse.Namespace) -> HostConfig:
    """:func:`config_from_args`, refused also when it names a backend that is not installed.

    What ``run`` starts with and what it reloads: the same checks both times.

    :raises ConfigError: an invalid config, or unknown backend names.
    """
    from devicehost.host.backends.loader import UnknownBackendError, check_names
    from devicehost.host.config import ConfigError

    config = config_from_args(args)
    try:
        check_names(config)
    except UnknownBackendError as exc:
        raise ConfigError(str(exc)) from exc
    return config


def settings_problems(backends: Sequence[Backend], config: HostConfig) -> list[str]:
    """A dry run of every backend's settings (model, then configure hook): ``key.path: why`` lines."""
    import asyncio

    from devicehost.host.backends.backend_set import refused_settings
    from devicehost.host.context import HostContext

    context = HostContext(config)
    for backend in backends:
        backend.link.bind(context)  # told the host's facts before the dry run, as when it serves
    refused = asyncio.run(refused_settings(backends, config.backends))
    return [line for problems in refused.values() for line in problems.splitlines()]


def dry_run_problems(backends: Sequence[Backend], config: HostConfig) -> list[str]:
    """What ``run`` would not serve of ``backends``, serving nothing: one line per problem.

    Each backend's settings are checked (its model, then its configure hook), then its
    discovery runs once and its answer is planned as ``run`` plans it: a discovery that raises
    or answers wrongly, and each resource the host would refuse (its name, its devices), is a
    problem naming the backend. A backend that offers no resource on this machine is not one
    (a node without the hardware serves nothing, and says so in ``/readyz``).
    """
    import asyncio

    from devicehost.host.backends.backend import HookError
    from devicehost.host.backends.backend_set import refused_settings
    from devicehost.host.reconcile import plan

    async def check() -> list[str]:
        from devicehost.host.context import HostContext

        context = HostContext(config)
        for backend in backends:
            backend.link.bind(context)  # as the host will: its facts and hook timeout
        refused = await refused_settings(backends, config.backends)
        problems = [line for lines in refused.values() for line in lines.splitlines()]
        offered: list[tuple[str, Any]] = []
        for backend in (b for b in backends if b.name not in refused):
            try:
                offered.append((backend.name, await backend.discover()))
            except HookError as exc:
                problems.append(f"backends.{backend.name}: discovery failed, nothing would be served: {exc}")
        problems += [
            f"backends.{r.backend}: resource {r.resource!r} would not be served: {r.problem}"
            for r in plan(offered, {}).refused
        ]
        return problems

    return asyncio.run(check())


def config_file_of(args: argparse.Namespace) -> Path | None:
    """The config file a running host follows: ``--config``, else $DEVICEHOST_CONFIG."""
    from devicehost.host.config import chosen_config_file

    return chosen_config_file(Path(args.config) if args.config else None)


def load_backend_statuses(config: HostConfig) -> list[BackendStatus]:
    """Every installed backend the config allows, loaded or with why not.

    :raises BackendLoadFailed: the allow-list names a backend that is not installed (usage error).
    """
    from devicehost.host.backends.loader import UnknownBackendError, load_backends

    try:
        return load_backends(config.enabled_backends, config.disabled_backends, config.hook_timeout)
    except UnknownBackendError as exc:
        raise BackendLoadFailed(str(exc), EXIT_USAGE) from exc
