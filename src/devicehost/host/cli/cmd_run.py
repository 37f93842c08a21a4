"""``devicehost run``: serve every backend's resources to the kubelet (or to a stand-in).

This module only turns the command line into a call: the composition root,
:func:`devicehost.host.app.run_host`, builds the host and owns its lifecycle, and
:func:`devicehost.host.simulate.run_simulated` puts a kubelet stand-in in front of it.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from devicehost.host.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    BackendLoadFailed,
    CommandFailed,
    add_config_options,
    checked_config,
    config_file_of,
    load_backend_statuses,
    set_handler,
    settings_problems,
)

if TYPE_CHECKING:
    import socket

    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig

NO_BACKEND = "no backend could be loaded; `devicehost backends` says why"


def add_parser(commands: Commands) -> None:
    run = commands.add_parser("run", help="serve every backend's resources to the kubelet")
    add_config_options(run)
    run.add_argument(
        "--simulate-kubelet",
        action="store_true",
        help="run a built-in kubelet stand-in in a temporary dir and show what it sees",
    )
    run.add_argument(
        "--kubernetes-version",
        metavar="VERSION",
        help="with --simulate-kubelet: the Kubernetes version its kubelet and API server present, "
        "1.34 to 1.37 (default 1.35)",
    )
    set_handler(run, run_command, load_config=checked_config)


SIMULATED_DIR = (
    "--device-plugins-dir cannot apply with --simulate-kubelet: the simulated kubelet serves "
    "a temporary dir of its own; drop one of the two"
)


VERSION_WITHOUT_SIMULATION = (
    "--kubernetes-version applies only with --simulate-kubelet: a real kubelet and API server "
    "have their own, which the host finds by itself"
)


def run_command(args: argparse.Namespace, config: HostConfig) -> int:
    """Load the backends, check their settings and the socket dirs, serve until a signal, then leave."""
    listener = listen_for_probes(config)  # first: probes wait in the backlog instead of being refused
    from devicehost.host import app
    from devicehost.host.logs import configure_logging

    if args.simulate_kubelet and args.device_plugins_dir is not None:
        raise CommandFailed(SIMULATED_DIR, EXIT_USAGE)
    if args.kubernetes_version and not args.simulate_kubelet:
        raise CommandFailed(VERSION_WITHOUT_SIMULATION, EXIT_USAGE)
    if args.kubernetes_version:
        from devicehost.standin.versions import parse

        try:
            parse(args.kubernetes_version)
        except ValueError as exc:
            raise CommandFailed(f"--kubernetes-version: {exc}", EXIT_USAGE) from None
    configure_logging(config.log_level, config.log_format)
    statuses = load_backend_statuses(config)
    backends = [s.backend for s in statuses if s.backend is not None]
    failed = {s.name: s.error for s in statuses if s.error is not None}
    if not backends:
        raise BackendLoadFailed(NO_BACKEND, EXIT_FAILED)
    refused = settings_problems(backends, config)
    if refused:
        raise CommandFailed("backend settings refused:\n  " + "\n  ".join(refused), EXIT_USAGE)
    if args.simulate_kubelet:
        from devicehost.host.simulate import run_simulated

        serve: Callable[..., Coroutine[Any, Any, None]] = functools.partial(
            run_simulated, kubernetes_version=args.kubernetes_version
        )
    else:
        check_socket_dirs(config)
        serve = app.run_host
    try:
        app.run_process(
            lambda: serve(
                config,
                backends,
                failed_backends=failed,
                reload_config=functools.partial(checked_config, args),
                config_file=config_file_of(args),
                metrics_listener=listener,
            )
        )
    except OSError as exc:  # a metrics address in use, a dir that went away: one line, no traceback
        raise CommandFailed(f"cannot start: {exc}", EXIT_FAILED) from exc


def listen_for_probes(config: HostConfig) -> socket.socket | None:
    """Listen on ``metrics_address`` before the slow imports and the backends' loading.

    :raises CommandFailed: one line: exit 1 when the address is taken (the README's "the host could
        not start"), 2 when it is malformed.
    """
    from devicehost.host.sockets import listen_early

    if not config.metrics_address:
        return None
    try:
        return listen_early(config.metrics_address)
    except OSError as exc:  # taken now, free later: the host could not start (the config is fine)
        raise CommandFailed(
            f"cannot listen on metrics address {config.metrics_address}: {exc.strerror or exc}", EXIT_FAILED
        ) from exc
    except ValueError as exc:  # not BIND:PORT: bad configuration
        raise CommandFailed(
            f"cannot listen on metrics address {config.metrics_address}: {exc}", EXIT_USAGE
        ) from exc


def check_socket_dirs(config: HostConfig) -> None:
    """The dirs the host will create sockets in exist, are writable, and (unless allowed) no symlinks.

    :raises CommandFailed: with the reason, as a usage error.
    """
    from devicehost.host.dra.names import DRA_ROOM
    from devicehost.host.sockets import SocketDirError, check_path_room, check_socket_dir

    try:
        check_socket_dir(config.device_plugins_dir, config.allow_symlinked_dirs)
        if config.registration_mode == "watcher":
            check_socket_dir(
                config.plugins_registry_dir,
                config.allow_symlinked_dirs,
                "plugins_registry dir",
                "plugins_registry_dir",
            )
        if config.node_name:  # DRA may serve: its sockets must fit below these dirs too
            check_path_room(config.plugins_registry_dir, "plugins_registry_dir")
            check_path_room(config.dra_plugins_dir, "dra_plugins_dir", DRA_ROOM)
    except SocketDirError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
