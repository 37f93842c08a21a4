"""What every ``devicehost`` command shares: exit codes, the config flags, backend loading, errors.

Nothing heavy is imported at module level (the config model, stevedore and the backends load
inside the functions), so ``devicehost --help`` stays quick.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
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

CONFIG_KEYS = (
    "device_plugins_dir",
    "plugins_registry_dir",
    "registration_mode",
    "metrics_address",
    "enabled_backends",
    "disabled_backends",
    "rediscover_interval",
    "health_interval",
    "hook_timeout",
    "log_level",
    "log_format",
)
"""The config keys a command-line flag may set; a command without the flag leaves the key alone."""


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
    parser.set_defaults(handler=handler, load_config=load_config or config_from_args)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """The flags that select the config file, the backends, the hook timeout and the logging."""
    parser.add_argument("--config", type=Path, help="YAML config file (env DEVICEHOST_CONFIG)")
    parser.add_argument(
        "--backend",
        dest="enabled_backends",
        action="append",
        metavar="NAME",
        help="load only this backend; repeatable (env DEVICEHOST_BACKENDS=a,b)",
    )
    parser.add_argument(
        "--disable",
        dest="disabled_backends",
        action="append",
        metavar="NAME",
        help="never load this backend; repeatable (env DEVICEHOST_DISABLED_BACKENDS=a,b)",
    )
    parser.add_argument(
        "--hook-timeout", type=float, metavar="SECONDS", help="seconds a backend hook may run (default 10)"
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="lowest level logged (default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        help="json off a terminal, console on one (default auto)",
    )


def config_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line gives (None where a flag is absent or not given)."""
    return {key: getattr(args, key, None) for key in CONFIG_KEYS}


def config_from_args(args: argparse.Namespace) -> HostConfig:
    """Defaults < the config file (``--config`` or $DEVICEHOST_CONFIG) < environment < flags."""
    from devicehost.host.config import build_config

    return build_config(getattr(args, "config", None), config_values(args))


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
