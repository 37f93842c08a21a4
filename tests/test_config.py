"""Configuration: precedence, validation messages, and the ``config`` commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devicehost.host.config import ConfigError, build_config


def test_command_line_beats_environment_beats_file_beats_defaults(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text("health_interval: 7\nhook_timeout: 3\nlog_level: warning\nsocket_mode: '0640'\n")
    env = {"DEVICEHOST_HOOK_TIMEOUT": "4", "DEVICEHOST_LOG_LEVEL": "error", "DEVICEHOST_BACKENDS": "a, b"}
    config = build_config(config_file, {"log_level": "debug", "enabled_backends": None}, env)
    assert config.health_interval == 7
    assert config.hook_timeout == 4
    assert config.log_level == "debug"
    assert config.enabled_backends == ("a", "b")
    assert config.socket_mode == 0o640
    assert config.rediscover_interval == 10


def test_config_file_from_environment(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text("metrics_address: 0.0.0.0:9464\n")
    assert build_config(None, {}, {"DEVICEHOST_CONFIG": str(config_file)}).metrics_address == "0.0.0.0:9464"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hook_timeout: -1\n", "hook_timeout: Input should be greater than 0 (got -1)"),
        ("backends: {example: 3}\n", "backends.example: Input should be a valid dictionary (got 3)"),
        (
            "registration_mode: sometimes\n",
            "registration_mode: Input should be 'auto', 'kubelet' or 'watcher'",
        ),
        ("metrics_address: nine\n", "metrics_address: Value error, must be HOST:PORT"),
        ("socket_mode: '0999'\n", "socket_mode: Value error, must be octal permission bits"),
        ("- a\n- b\n", "must hold a mapping of keys, not list"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_files_name_the_key_and_what_it_expects(tmp_path: Path, text: str, message: str) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(text)
    with pytest.raises(ConfigError) as caught:
        build_config(config_file, {}, {})
    assert message in str(caught.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.yaml: No such file"):
        build_config(tmp_path / "nope.yaml", {}, {})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devicehost", *args], capture_output=True, text=True, timeout=30
    )


def test_config_check_and_show(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("enabled_backends: [example]\nbackends: {example: {resources: {example.com/w: 2}}}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rediscover_interval: often\n")
    assert run_cli("config", "check", str(good)).stdout == f"{good}: valid\n"
    result = run_cli("config", "check", str(bad))
    assert result.returncode == 2
    assert "rediscover_interval: Input should be a valid number" in result.stderr
    shown = run_cli("config", "show", "--config", str(good), "--hook-timeout", "2.5")
    effective = yaml.safe_load(shown.stdout)
    assert effective["hook_timeout"] == 2.5
    assert effective["enabled_backends"] == ["example"]
    assert effective["backends"] == {"example": {"resources": {"example.com/w": 2}}}
    assert effective["socket_mode"] == "0600"
    assert effective["device_plugins_dir"] == "/var/lib/kubelet/device-plugins"
