"""The ``devicehost`` command: ``run`` the daemon, list ``backends``.

Heavy imports (grpc, the generated code) happen inside the commands, so ``--help`` is quick and
``run`` reaches its first registration as early as it can.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _add_config_options(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devicehost", description="One host process for Kubernetes device plugins."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="serve every backend's resources to the kubelet")
    _add_config_options(run)
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

    backends = commands.add_parser("backends", help="list installed backends, their status and resources")
    _add_config_options(backends)

    config = commands.add_parser("config", help="validate a config file or show the effective configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate FILE without starting anything")
    check.add_argument("file", type=Path, metavar="FILE")
    show = config_commands.add_parser("show", help="print the configuration flags, env and file add up to")
    _add_config_options(show)

    status = commands.add_parser("status", help="show the state of a running host (its /status endpoint)")
    status.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="the host's metrics address (default: metrics_address of the config / DEVICEHOST_METRICS_ADDRESS)",
    )
    status.add_argument("--config", type=Path, help="YAML config file (env DEVICEHOST_CONFIG)")
    return parser


def _cli_values(args: argparse.Namespace) -> dict[str, Any]:
    keys = (
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
    return {key: getattr(args, key, None) for key in keys}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from devicehost.host.config import ConfigError, build_config

    def load() -> Any:
        if args.command == "config" and args.config_command == "check":
            return build_config(args.file, environ={})
        return build_config(args.config, _cli_values(args))

    try:
        config = load()
    except ConfigError as exc:
        print(f"devicehost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "config":
        return _config_command(args, config)
    if args.command == "status":
        from devicehost.host.ops.status import print_status

        return print_status(args.address or config.metrics_address)
    if args.command == "backends":
        return _backends_command(config)
    config_file = args.config or (
        Path(os.environ["DEVICEHOST_CONFIG"]) if os.environ.get("DEVICEHOST_CONFIG") else None
    )
    return _run_command(config, load, config_file, simulate=args.simulate_kubelet)


def _config_command(args: argparse.Namespace, config: Any) -> int:
    if args.config_command == "check":
        print(f"{args.file}: valid")
        return EXIT_OK
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
    return EXIT_OK


def _load(config: Any) -> Any:
    """Load backends or explain why not; returns the statuses or an exit code."""
    from devicehost.host.backends.loader import UnknownBackendError, load_backends

    try:
        return load_backends(config.enabled_backends, config.disabled_backends, config.hook_timeout)
    except UnknownBackendError as exc:
        print(f"devicehost: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_command(config: Any, reload_config: Any, config_file: Path | None, simulate: bool) -> int:
    from devicehost.host.logs import configure_logging

    configure_logging(config.log_level, config.log_format)
    statuses = _load(config)
    if isinstance(statuses, int):
        return statuses
    backends = [s.backend for s in statuses if s.backend is not None]
    failed = {s.name: s.error for s in statuses if s.error is not None}
    if not backends:
        print("devicehost: no backend could be loaded; `devicehost backends` says why", file=sys.stderr)
        return EXIT_FAILED
    if simulate:
        from devicehost.host.simulate import run_simulated

        _exit_now(asyncio.run(run_simulated(config, backends, reload_config, failed, config_file)))
    else:
        from devicehost.host.daemon import Host, install_signal_handlers
        from devicehost.host.sockets import SocketDirError, check_socket_dir

        try:
            check_socket_dir(config.device_plugins_dir, config.allow_symlinked_dirs)
            if config.registration_mode == "watcher":
                check_socket_dir(
                    config.plugins_registry_dir, config.allow_symlinked_dirs, "plugins_registry dir"
                )
        except SocketDirError as exc:
            print(f"devicehost: {exc}", file=sys.stderr)
            return EXIT_USAGE

        async def serve() -> None:
            host = Host(config, backends, reload_config, failed, config_file)
            install_signal_handlers(host, lambda: os._exit(EXIT_FAILED))
            await host.run()
            _exit_now(EXIT_OK)

        asyncio.run(serve())
    return EXIT_FAILED  # not reached: _exit_now leaves


def _exit_now(code: int) -> NoReturn:
    """Leave once every socket is removed and every stop hook has run.

    Hook threads that never returned, and grpc's own teardown at interpreter exit, must not keep
    the pod in Terminating after the host has cleaned up.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away loses the tail
            stream.flush()
    os._exit(code)


def _backends_command(config: Any) -> int:
    from devicehost.host.logs import configure_logging

    configure_logging("error", config.log_format, sys.stderr)
    statuses = _load(config)
    if isinstance(statuses, int):
        return statuses
    if not statuses:
        print("no backends installed (entry point group devicehost.backends)")
        return EXIT_OK

    async def discover(backend: Any) -> str:
        from devicehost.host.backends.backend import HookError

        try:
            if backend.implements("devicehost_configure"):
                await backend.configure(config.backends.get(backend.name, {}))
            resources = await backend.discover()
        except HookError as exc:
            return f"    discovery failed: {exc}"
        if not resources:
            return "    no resources"
        return "\n".join(
            f"    {r.name}: {len(r.devices)} devices ({sum(d.health == 'Healthy' for d in r.devices)} healthy)"
            for r in resources
        )

    for status in statuses:
        where = f"{status.distribution or '?'} {status.version or '?'}"
        if status.disabled:
            state = "disabled"
        elif status.error:
            state = f"FAILED: {status.error}"
        else:
            state = "loaded"
        print(f"{status.name}  ({where}, {status.target})  {state}")
        if status.backend is not None:
            print(asyncio.run(discover(status.backend)))
            status.backend.close()
    return EXIT_OK
