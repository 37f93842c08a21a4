"""``devicehost config check FILE`` and ``devicehost config show``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from devicehost.host.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailed,
    add_config_options,
    dry_run_problems,
    load_backend_statuses,
    set_handler,
)

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig


def add_parser(commands: Commands) -> None:
    config = commands.add_parser("config", help="validate a config file or show the effective configuration")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate FILE without starting anything")
    check.add_argument("file", type=Path, metavar="FILE")
    set_handler(check, check_command, load_config=config_from_file_only)
    show = actions.add_parser("show", help="print the configuration flags, env and file add up to")
    add_config_options(show)
    set_handler(show, show_command)


def config_from_file_only(args: argparse.Namespace) -> HostConfig:
    """FILE alone over the defaults: what it says, whatever this shell's environment holds."""
    from devicehost.host.config import build_config

    return build_config(Path(args.file), environ={})


def check_command(args: argparse.Namespace, config: HostConfig) -> int:
    """What ``run`` would refuse or not serve, serving nothing.

    ``main`` has reported unknown keys and wrong types before any handler runs. Then: unknown
    backend names (exit 2); an enabled backend that fails to load (exit 1, as ``run`` exits
    when none loads); and for every loaded one a dry run of its settings (its settings model,
    its configure hook) and of its discovery, planned as ``run`` plans it (exit 2).
    """
    import sys

    from devicehost.host.backends.loader import UnknownBackendError, check_names
    from devicehost.host.logs import configure_logging

    try:
        check_names(config)
    except UnknownBackendError as exc:
        raise CommandFailed(f"{args.file}: {exc}", EXIT_USAGE) from exc
    configure_logging("critical", config.log_format, sys.stderr)  # a load failure is said below, once
    statuses = load_backend_statuses(config)
    configure_logging("error", config.log_format, sys.stderr)  # what backends log in the dry run
    backends = [s.backend for s in statuses if s.backend is not None]
    unloaded = [
        s for s in statuses if s.error is not None and (s.name in config.enabled_backends or not backends)
    ]
    if unloaded:
        for backend in backends:
            backend.close()
        lines = [f"backend {s.name}: failed to load: {s.error}" for s in unloaded]
        raise CommandFailed(f"{args.file}: `run` would not serve:\n  " + "\n  ".join(lines), EXIT_FAILED)
    try:
        refused = dry_run_problems(backends, config)
    finally:
        for backend in backends:
            backend.close()
    if refused:
        raise CommandFailed(f"{args.file}: `run` would not serve:\n  " + "\n  ".join(refused), EXIT_USAGE)
    print(f"{args.file}: valid")
    return EXIT_OK


def show_command(args: argparse.Namespace, config: HostConfig) -> int:
    """The effective configuration as YAML, in the model's key order."""
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
    return EXIT_OK
