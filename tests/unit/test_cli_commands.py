"""The handlers of ``config check``, ``config show``, ``backends`` and ``status``, run in-process."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicehost.host.backends import loader
from devicehost.host.backends.loader import BackendStatus
from devicehost.host.cli import main
from devicehost.host.cli.cmd_backends import describe

pytestmark = pytest.mark.usefixtures("logging_untouched")


def test_config_check_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("health_interval: 2\nenabled_backends: [example]\nbackends: {example: {numa_nodes: 2}}\n")
    assert main(["config", "check", str(good)]) == 0
    assert capsys.readouterr() == (f"{good}: valid\n", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("health_interval: soon\n", "health_interval: Input should be a valid number"),
        ("not_a_key: 1\n", "not_a_key: unknown key (valid keys: allow_symlinked_dirs, backends, cdi_dir, "),
        (
            "rediscover_intervall: 1\n",
            "rediscover_intervall: unknown key, did you mean 'rediscover_interval'?",
        ),
        ("- a list\n", "must hold a mapping of keys, not list"),
        ("a: [\n", "is not valid YAML"),
        ("socket_mode: '0999'\n", "socket_mode: Value error, must be octal permission bits"),
    ],
)
def test_config_check_invalid_is_a_usage_error(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["config", "check", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("devicehost: ")
    assert message in err


def test_config_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(tmp_path / "nope.yaml")]) == 2
    assert f"devicehost: cannot read config file {tmp_path / 'nope.yaml'}" in capsys.readouterr().err


def test_config_show_adds_up_file_env_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("health_interval: 1\nsocket_mode: 0o660\nbackends: {example: {cdi: true}}\n")
    monkeypatch.setenv("DEVICEHOST_METRICS_ADDRESS", "127.0.0.1:9464")
    assert main(["config", "show", "--config", str(config_file), "--backend", "example"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert shown["health_interval"] == 1.0
    assert shown["socket_mode"] == "0660"
    assert shown["metrics_address"] == "127.0.0.1:9464"
    assert shown["enabled_backends"] == ["example"]
    assert shown["backends"] == {"example": {"cdi": True}}
    assert next(iter(shown)) == "device_plugins_dir"  # the model's order, not sorted


def test_config_show_bad_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DEVICEHOST_REGISTRATION_MODE", "sometimes")
    assert main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("devicehost: invalid configuration (environment")
    assert "registration_mode" in err


def test_backends_lists_status_and_resources(
    logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backends", "--backend", "example", "--log-format", "console"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "example  (devicehost-example 0.1.0, devicehost_example:ExampleBackend)  loaded",
        "    example.com/widget: 4 devices (4 healthy)",
    ]
    assert err == ""
    assert logging_calls == [("error", "console", sys.stderr)]  # log lines stay off the listing


def test_backends_configures_each_backend_from_the_config(
    tmp_path: Path, logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        "backends:\n  example:\n    resources: {example.com/gadget: 2, example.com/gizmo: 0}\n"
    )
    assert main(["backends", "--backend", "example", "--config", str(config_file)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "    example.com/gadget: 2 devices (2 healthy)",
        "    example.com/gizmo: 0 devices (0 healthy)",
    ]


def test_backends_reports_a_failing_discovery(
    tmp_path: Path, logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("backends: {example: {numa_nodes: 0}}\n")
    assert main(["backends", "--backend", "example", "--config", str(config_file)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == "    settings refused: backends.example.numa_nodes: Input should be greater than 0 (got 0)"


def test_backends_shows_disabled_ones(
    logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backends", "--disable", "hostdev"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "example  (devicehost-example 0.1.0, devicehost_example:ExampleBackend)  loaded" in lines
    where = lines.index("hostdev  (devicehost-hostdev 0.1.0, devicehost_hostdev:HostdevBackend)  disabled")
    following = lines[where + 1 : where + 2]
    assert not any(line.startswith("    ") for line in following)  # a disabled one is not asked


def test_backends_unknown_name_is_a_usage_error(
    logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backends", "--backend", "nosuch"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("devicehost: unknown backend(s): nosuch (in enabled_backends); installed: ")
    assert "example" in err


def test_backends_none_installed(
    monkeypatch: pytest.MonkeyPatch, logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(loader, "load_backends", lambda *_: [])
    assert main(["backends"]) == 0
    assert capsys.readouterr().out == "no backends installed (entry point group devicehost.backends)\n"


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (BackendStatus("a", "m:A", "dist-a", "1.0"), "a  (dist-a 1.0, m:A)  loaded"),
        (BackendStatus("b", "m:B", None, None, disabled=True), "b  (? ?, m:B)  disabled"),
        (BackendStatus("c", "m:C", "dist-c", None, error="it broke"), "c  (dist-c ?, m:C)  FAILED: it broke"),
    ],
)
def test_describe(status: BackendStatus, line: str) -> None:
    assert describe(status) == line


def test_status_without_an_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 2
    assert capsys.readouterr() == (
        "",
        "devicehost: no address: pass --address HOST:PORT or set metrics_address\n",
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("source", ["flag", "env", "file"])
def test_status_asks_the_configured_address(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    argv = ["status"]
    if source == "flag":
        monkeypatch.setenv("DEVICEHOST_METRICS_ADDRESS", "127.0.0.1:1")  # the flag wins
        argv += ["--address", address]
    elif source == "env":
        monkeypatch.setenv("DEVICEHOST_METRICS_ADDRESS", address)
    else:
        (tmp_path / "c.yaml").write_text(f"metrics_address: '{address}'\n")
        argv += ["--config", str(tmp_path / "c.yaml")]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith(f"devicehost: no host answers at {address}: ")
