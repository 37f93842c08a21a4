"""The ``devicehost`` parser: each command reaches its handler, each flag the config key it feeds."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devicehost.host.cli import build_parser, cmd_backends, cmd_config, cmd_run, cmd_status, main, parse
from devicehost.host.cli.common import checked_config, config_file_of, config_from_args
from devicehost.host.config import HostConfig, Setting, settings


@pytest.mark.parametrize(
    ("argv", "handler", "load_config"),
    [
        (["run"], cmd_run.run_command, checked_config),
        (["run", "--simulate-kubelet"], cmd_run.run_command, checked_config),
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
        ["backends", "--simulate-kubelet"],
        ["run", "--socket-mode"],
        ["run", "--no-such-flag"],
        ["status", "--backend", "example"],
        ["config", "show", "--simulate-kubelet"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert "usage: devicehost" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "usage", "unknown"),
    [
        (["run", "--bogus"], "usage: devicehost run [-h]", "--bogus"),
        (["backends", "--simulate-kubelet"], "usage: devicehost backends [-h]", "--simulate-kubelet"),
        (
            ["config", "check", "x.yaml", "--backend", "a"],
            "usage: devicehost config check [-h] FILE",
            "--backend a",
        ),
        (["status", "--backend", "example"], "usage: devicehost status [-h]", "--backend example"),
    ],
)
def test_an_unknown_flag_prints_the_usage_of_its_own_command(
    argv: list[str], usage: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert err.endswith(f"error: unrecognized arguments: {unknown}\n")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import devicehost

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"devicehost {devicehost.__version__}\n"


FLAGS = [
    (["run", "--backend", "example", "--backend", "hostdev"], "enabled_backends", ("example", "hostdev")),
    (["run", "--backend", "example,hostdev"], "enabled_backends", ("example", "hostdev")),
    (["run", "--disable", "example", "--disable", "nvidia"], "disabled_backends", ("example", "nvidia")),
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


SAMPLES = {
    "socket_mode": ("640", 0o640),
    "metrics_address": ("127.0.0.1:9999", "127.0.0.1:9999"),
    "preferred_allocation": ("{example.com/widget: numa-pack}", {"example.com/widget": "numa-pack"}),
    # dra and both need node_name too; one setting at a time, device-plugin is what is left to say
    "serve_through": ("{example: device-plugin}", {"example": "device-plugin"}),
    "dra_drivers": (
        "{example.com/widget: widgets.example.com}",
        {"example.com/widget": "widgets.example.com"},
    ),
    "node_name": ("node-a", "node-a"),
    "kubeconfig": ("/x/kubeconfig", Path("/x/kubeconfig")),
    "dra_unhealthy_taint": ("NoExecute", "NoExecute"),
}
"""Keys whose type alone does not give a valid non-default value (see :func:`sample`)."""


def sample(setting: Setting) -> tuple[str, object]:
    """A non-default value for ``setting``: as a flag/variable spells it, and as the model holds it."""
    field = HostConfig.model_fields[setting.key]
    if setting.key in SAMPLES:
        return SAMPLES[setting.key]
    if setting.shape == "switch":
        return ("false", False) if field.default else ("true", True)
    if setting.shape == "list":
        return "a, b", ("a", "b")
    if setting.shape == "mapping":
        return "{example: {numa_nodes: 2}}", {"example": {"numa_nodes": 2}}
    if setting.choices:
        choice = next(c for c in setting.choices if c != field.default)
        return choice, choice
    if field.annotation is Path:
        return f"/x/{setting.key}", Path(f"/x/{setting.key}")
    if field.annotation is float:
        return "7.5", 7.5
    raise AssertionError(f"add a sample value of {setting.key} to SAMPLES")


@pytest.mark.parametrize("command", [["run"], ["backends"], ["config", "show"]])
@pytest.mark.parametrize("setting", settings(), ids=lambda s: s.key)
def test_every_setting_is_a_flag_of_every_command_that_reads_the_config(
    setting: Setting, command: list[str]
) -> None:
    raw, value = sample(setting)
    if setting.shape == "switch":  # --x turns it on, --no-x off
        argv = [*command, setting.flag if value else f"--no-{setting.flag[2:]}"]
    else:
        argv = [*command, setting.flag, raw]
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    assert getattr(config, setting.key) == value
    assert value != HostConfig.model_fields[setting.key].default


@pytest.mark.parametrize("setting", settings(), ids=lambda s: s.key)
def test_every_setting_is_an_environment_variable(setting: Setting) -> None:
    from devicehost.host.config import build_config

    raw, value = sample(setting)
    assert setting.env.startswith("DEVICEHOST_")
    assert getattr(build_config(None, {}, {setting.env: raw}), setting.key) == value


def test_every_flag_of_a_config_command_is_a_setting() -> None:
    """No hand-written flag beside the generated ones that would feed the config by another path."""
    keys = set(HostConfig.model_fields)
    for sub in _subparsers(build_parser()):
        for action in sub._actions:
            if action.dest in keys:
                assert action.option_strings[0] == next(s.flag for s in settings() if s.key == action.dest)


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
    # pydantic and yaml are in: the flags are generated from the config model, and every command
    # builds its config right after parsing anyway.
    heavy = (
        "grpc",
        "asyncio",
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


def test_the_config_run_reloads_refuses_unknown_backend_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` starts and reloads with checked_config: a reload naming an unknown backend is refused
    (the host logs it and keeps its running config) the same way start is."""
    from devicehost.host.config import ConfigError

    config_file = tmp_path / "config.yaml"
    config_file.write_text("enabled_backends: [example]\n")
    args = build_parser().parse_args(["run", "--config", str(config_file)])
    assert checked_config(args).enabled_backends == ("example",)
    config_file.write_text("enabled_backends: [example]\nbackends: {exampel: {}}\n")
    with pytest.raises(ConfigError, match=r"exampel \(in backends, did you mean 'example'\?\)"):
        checked_config(args)
