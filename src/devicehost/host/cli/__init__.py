"""The ``devicehost`` command: ``run`` the daemon, list ``backends``, check ``config`` and claims
(``check-claim``), ask ``status``.

One module per command (``cmd_*.py``), each declaring its parser and its handler with
``set_handler``; :func:`main` only parses, builds the configuration and dispatches. Heavy imports
(grpc, the generated code, the daemon) happen inside the handlers, so ``--help`` is quick and
``run`` reaches its first registration as early as it can.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from devicehost.host.cli import (
    cmd_backends,
    cmd_check_claim,
    cmd_config,
    cmd_new_backend,
    cmd_run,
    cmd_status,
    cmd_webhook,
)
from devicehost.host.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandFailed, Parser

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands, ConfigLoader, Handler

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

COMMANDS: tuple[Callable[[Commands], None], ...] = (
    cmd_run.add_parser,
    cmd_backends.add_parser,
    cmd_config.add_parser,
    cmd_status.add_parser,
    cmd_new_backend.add_parser,
    cmd_webhook.add_parser,
    cmd_check_claim.add_parser,
)
"""Each command's parser, in the order ``--help`` lists them."""


class VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import devicehost

        print(f"devicehost {devicehost.__version__}")
        parser.exit()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; an unknown flag is reported with the usage of its own command."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        command_parser: argparse.ArgumentParser = args.command_parser
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="devicehost", description="One host process for Kubernetes device plugins.")
    parser.add_argument("--version", action=VersionAction, help="print devicehost's version and exit")
    commands = cast("Commands", parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    for add_parser in COMMANDS:
        add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, build the configuration, run the command; its exit status (2 for usage errors)."""
    args = parse(argv)
    from devicehost.host.logs import quiet_grpc_core

    quiet_grpc_core()  # before any command imports grpc: C-core reads it only then
    from devicehost.host.config import ConfigError

    load_config: ConfigLoader = args.load_config
    handler: Handler = args.handler
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"devicehost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args, config)
    except CommandFailed as exc:
        print(f"devicehost: {exc.message}", file=sys.stderr)
        return exc.exit_code
