"""``devicehost run``: serve every backend's resources to the kubelet (or to a stand-in).

This module only turns the command line into a call: the composition root,
:func:`devicehost.host.app.run_host`, builds the host and owns its lifecycle, and
:func:`devicehost.host.simulate.run_simulated` puts a kubelet stand-in in front of it.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from devicehost.host.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    BackendLoadFailed,
    CommandFailed,
    add_config_options,
    config_file_of,
    config_from_args,
    load_backend_statuses,
    set_handler,
)

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig

NO_BACKEND = "no backend could be loaded; `devicehost backends` says why"


def add_parser(commands: Commands) -> None:
    run = commands.add_parser("run", help="serve every backend's resources to the kubelet")
    add_config_options(run)
    run.add_argument(
        "--device-plugins-dir",
        type=Path,
        metavar="DIR",
        help="the kubelet's device-plugins dir (default /var/lib/kubelet/device-plugins; "
        "env DEVICEHOST_DEVICE_PLUGINS_DIR)",
    )
    run.add_argument(
        "--rediscover-interval", type=float, metavar="SECONDS", help="seconds between discoveries"
    )
    run.add_argument("--health-interval", type=float, metavar="SECONDS", help="seconds between health polls")
    run.add_argument(
        "--simulate-kubelet",
        action="store_true",
        help="run a built-in kubelet stand-in in a temporary dir and show what it sees",
    )
    set_handler(run, run_command)


def run_command(args: argparse.Namespace, config: HostConfig) -> int:
    """Load the backends, check the socket dirs, serve until a signal, then leave at once."""
    from devicehost.host import app
    from devicehost.host.logs import configure_logging

    configure_logging(config.log_level, config.log_format)
    statuses = load_backend_statuses(config)
    backends = [s.backend for s in statuses if s.backend is not None]
    failed = {s.name: s.error for s in statuses if s.error is not None}
    if not backends:
        raise BackendLoadFailed(NO_BACKEND, EXIT_FAILED)
    if args.simulate_kubelet:
        from devicehost.host.simulate import run_simulated as serve
    else:
        check_socket_dirs(config)
        serve = app.run_host
    app.run_process(
        lambda: serve(
            config,
            backends,
            failed_backends=failed,
            reload_config=functools.partial(config_from_args, args),
            config_file=config_file_of(args),
        )
    )


def check_socket_dirs(config: HostConfig) -> None:
    """The dirs the host will create sockets in exist, are writable, and (unless allowed) no symlinks.

    :raises CommandFailed: with the reason, as a usage error.
    """
    from devicehost.host.sockets import SocketDirError, check_socket_dir

    try:
        check_socket_dir(config.device_plugins_dir, config.allow_symlinked_dirs)
        if config.registration_mode == "watcher":
            check_socket_dir(config.plugins_registry_dir, config.allow_symlinked_dirs, "plugins_registry dir")
    except SocketDirError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
