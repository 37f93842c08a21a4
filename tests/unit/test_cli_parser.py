"""The ``devicehost`` parser: each command reaches its handler, each flag the config key it feeds."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devicehost.host.cli import build_parser, cmd_backends, cmd_config, cmd_run, cmd_status
from devicehost.host.cli.common import CONFIG_KEYS, config_file_of, config_from_args
from devicehost.host.config import HostConfig


@pytest.mark.parametrize(
    ("argv", "handler", "load_config"),
    [
        (["run"], cmd_run.run_command, config_from_args),
        (["run", "--simulate-kubelet"], cmd_run.run_command, config_from_args),
        (["backends"], cmd_backends.backends_command, config_from_args),
        (["config", "check", "x.yaml"], cmd_config.check_command, cmd_config.config_from_file_only),
        (["config", "show"], cmd_config.show_command, config_from_args),
        (["status"], cmd_status.status_command, config_from_args),
    ],
)
def test_each_command_maps_to_its_handler(argv: list[str], handler: Any, load_config: Any) -> None:
    args = build_parser().parse_args(argv)
    assert args.handler is handler
    assert args.load_config is load_config


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["config"],
        ["config", "check"],
        ["nosuch"],
        ["run", "--log-level", "loud"],
        ["run", "--log-format", "xml"],
        ["run", "--hook-timeout", "soon"],
        ["backends", "--device-plugins-dir", "/tmp"],
        ["status", "--backend", "example"],
        ["config", "show", "--simulate-kubelet"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "usage: devicehost" in capsys.readouterr().err


FLAGS = [
    (["run", "--backend", "a", "--backend", "b"], "enabled_backends", ("a", "b")),
    (["run", "--disable", "a", "--disable", "b"], "disabled_backends", ("a", "b")),
    (["run", "--hook-timeout", "2.5"], "hook_timeout", 2.5),
    (["run", "--log-level", "debug"], "log_level", "debug"),
    (["run", "--log-format", "console"], "log_format", "console"),
    (["run", "--device-plugins-dir", "/x/dp"], "device_plugins_dir", Path("/x/dp")),
    (["run", "--rediscover-interval", "3"], "rediscover_interval", 3.0),
    (["run", "--health-interval", "0.5"], "health_interval", 0.5),
    (["backends", "--backend", "example"], "enabled_backends", ("example",)),
    (["backends", "--disable", "nvidia"], "disabled_backends", ("nvidia",)),
    (["backends", "--hook-timeout", "4"], "hook_timeout", 4.0),
    (["backends", "--log-format", "json"], "log_format", "json"),
    (["config", "show", "--log-level", "error"], "log_level", "error"),
    (["config", "show", "--backend", "x"], "enabled_backends", ("x",)),
]


@pytest.mark.parametrize(("argv", "key", "value"), FLAGS)
def test_each_flag_feeds_its_config_key(argv: list[str], key: str, value: object) -> None:
    args = build_parser().parse_args(argv)
    config: HostConfig = args.load_config(args)
    assert getattr(config, key) == value
    assert getattr(config, key) != HostConfig.model_fields[key].default


def test_every_flag_that_names_a_config_key_is_passed_on() -> None:
    """A flag whose dest is a config key but is missing from CONFIG_KEYS would be dropped silently."""
    fields = set(HostConfig.model_fields)
    dests = {
        action.dest for sub in _subparsers(build_parser()) for action in sub._actions if action.dest in fields
    }
    assert dests
    assert dests <= set(CONFIG_KEYS)
    assert set(CONFIG_KEYS) <= fields


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_subparsers(sub)]
    return found


def test_flags_win_over_environment_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("health_interval: 1\nrediscover_interval: 2\nhook_timeout: 3\n")
    monkeypatch.setenv("DEVICEHOST_REDISCOVER_INTERVAL", "20")
    monkeypatch.setenv("DEVICEHOST_HOOK_TIMEOUT", "30")
    args = build_parser().parse_args(["run", "--config", str(config_file), "--hook-timeout", "300"])
    config = config_from_args(args)
    assert (config.health_interval, config.rediscover_interval, config.hook_timeout) == (1, 20, 300)


def test_config_check_reads_the_file_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("health_interval: 1\n")
    monkeypatch.setenv("DEVICEHOST_HEALTH_INTERVAL", "not a number")
    monkeypatch.setenv("DEVICEHOST_CONFIG", str(tmp_path / "other.yaml"))
    args = build_parser().parse_args(["config", "check", str(config_file)])
    assert args.load_config(args).health_interval == 1


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["run"], None, None),
        (["run"], "/etc/from-env.yaml", Path("/etc/from-env.yaml")),
        (["run", "--config", "/etc/flag.yaml"], "/etc/from-env.yaml", Path("/etc/flag.yaml")),
    ],
)
def test_the_config_file_a_host_follows(
    argv: list[str], env: str | None, expected: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv("DEVICEHOST_CONFIG", env)
    assert config_file_of(build_parser().parse_args(argv)) == expected


def test_help_imports_nothing_heavy() -> None:
    """``--help`` and parsing stay quick: no grpc, pydantic, asyncio or daemon until a handler runs."""
    heavy = (
        "grpc",
        "pydantic",
        "asyncio",
        "yaml",
        "structlog",
        "devicehost.host.app",
        "devicehost.host.daemon",
    )
    code = (
        "import sys\n"
        "from devicehost.host.cli import build_parser\n"
        "build_parser().parse_args(['run', '--backend', 'x'])\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} or m in {heavy!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"
