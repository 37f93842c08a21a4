"""``devicehost status``: ask a running host for its ``/status`` and print it for a person."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from devicehost.host.cli.common import EXIT_USAGE, CommandFailed, set_handler

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig


def add_parser(commands: Commands) -> None:
    status = commands.add_parser("status", help="show the state of a running host (its /status endpoint)")
    status.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="the host's metrics address (default: metrics_address of the config / DEVICEHOST_METRICS_ADDRESS)",
    )
    status.add_argument("--config", type=Path, help="YAML config file (env DEVICEHOST_CONFIG)")
    set_handler(status, status_command)


def status_command(args: argparse.Namespace, config: HostConfig) -> int:
    """0 when printed, 1 when no host answers, 2 when there is no address to ask or it is malformed."""
    from devicehost.host.config import check_address
    from devicehost.host.ops.status import print_status

    address: str = args.address or config.metrics_address
    if address:
        try:
            check_address(address)
        except ValueError as exc:
            raise CommandFailed(f"--address {address}: {exc}", EXIT_USAGE) from None
    return print_status(address)
