"""``devicehost run`` in-process: its errors before serving, and what it hands the composition root."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from devicehost.host import app, simulate
from devicehost.host.backends.backend import Backend
from devicehost.host.cli import main
from devicehost.host.config import HostConfig

NO_BACKEND = "devicehost: no backend could be loaded; `devicehost backends` says why\n"


class Served:
    """Stands in for app.run_host / simulate.run_simulated: records the call, closes the backends."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(
        self,
        config: HostConfig,
        backends: Sequence[Backend],
        *,
        failed_backends: Mapping[str, str] | None = None,
        reload_config: Callable[[], HostConfig] | None = None,
        config_file: Path | None = None,
        metrics_listener: socket.socket | None = None,
        kubernetes_version: str | None = None,
    ) -> None:
        self.calls.append(
            {
                "config": config,
                "backends": [b.name for b in backends],
                "failed_backends": failed_backends,
                "reload_config": reload_config,
                "config_file": config_file,
                "metrics_listener": metrics_listener,
                "kubernetes_version": kubernetes_version,
            }
        )
        if metrics_listener is not None:
            metrics_listener.close()
        for backend in backends:
            backend.close()


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """exit_now raises SystemExit instead of os._exit, so the test process lives on."""

    def exit_now(code: int) -> NoReturn:
        raise SystemExit(code)

    monkeypatch.setattr(app, "exit_now", exit_now)


@pytest.fixture
def run_host(monkeypatch: pytest.MonkeyPatch, exits: None) -> Served:
    served = Served()
    monkeypatch.setattr(app, "run_host", served)
    return served


@pytest.fixture
def run_simulated(monkeypatch: pytest.MonkeyPatch, exits: None) -> Served:
    served = Served()
    monkeypatch.setattr(simulate, "run_simulated", served)
    return served


def test_unknown_backend_is_a_usage_error(
    logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--backend", "nosuch", "--backend", "example", "--log-level", "warning"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("devicehost: unknown backend(s): nosuch (in enabled_backends); installed: ")
    assert logging_calls == []  # refused with the config, before anything else


def test_no_backend_loaded_fails(
    logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--backend", "example", "--disable", "example"]) == 1
    assert capsys.readouterr().err == NO_BACKEND


def test_only_broken_backends_fail(
    fake_site: Path, logging_calls: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--backend", "broken", "--backend", "asyncy"]) == 1
    assert capsys.readouterr().err.endswith(NO_BACKEND)


def _symlink(tmp: Path) -> Path:
    (tmp / "real").mkdir()
    (tmp / "link").symlink_to(tmp / "real")
    return tmp / "link"


def _long(tmp: Path) -> Path:
    """A dir whose path leaves 7 bytes too few for the shortest socket name (33 bytes and a /)."""
    made = tmp / ("d" * (107 - 33 - 1 + 7 - len(str(tmp)) - 1))
    made.mkdir()
    return made


def _file(tmp: Path) -> Path:
    (tmp / "file").write_text("")
    return tmp / "file"


@pytest.mark.parametrize(
    ("make_dir", "env", "message"),
    [
        (
            lambda tmp: tmp / "nope",
            {},
            "device-plugins dir {dir} does not exist: is the kubelet's dir mounted",
        ),
        (_file, {}, "device-plugins dir {dir} is not a directory"),
        (_symlink, {}, "device-plugins dir {dir} is a symlink (or lies under one) to "),
        (
            lambda tmp: tmp,
            {"DEVICEHOST_REGISTRATION_MODE": "watcher", "DEVICEHOST_PLUGINS_REGISTRY_DIR": "/nonexistent/pr"},
            "plugins_registry dir /nonexistent/pr does not exist",
        ),
        (
            _long,
            {},
            "device_plugins_dir {dir} is too long for unix sockets by 7 bytes: a socket path has at most 107",
        ),
        (
            lambda tmp: tmp,
            {"DEVICEHOST_NODE_NAME": "n", "DEVICEHOST_DRA_PLUGINS_DIR": "/" + "p" * 70},
            "dra_plugins_dir /" + "p" * 70 + " is too long for unix sockets by 2 bytes",
        ),
    ],
    ids=["missing", "a-file", "symlinked", "watcher-registry-missing", "too-long", "dra-too-long"],
)
def test_unusable_socket_dir_is_a_usage_error(
    make_dir: Callable[[Path], Path],
    env: dict[str, str],
    message: str,
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    logging_calls: list[tuple[Any, ...]],
    run_host: Served,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    directory = make_dir(short_tmp)
    assert main(["run", "--backend", "example", "--device-plugins-dir", str(directory)]) == 2
    assert capsys.readouterr().err.startswith("devicehost: " + message.format(dir=directory))
    assert run_host.calls == []


def test_symlinked_dir_is_served_when_allowed(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, logging_calls: list[tuple[Any, ...]], run_host: Served
) -> None:
    monkeypatch.setenv("DEVICEHOST_ALLOW_SYMLINKED_DIRS", "true")
    with pytest.raises(SystemExit) as exited:
        main(["run", "--backend", "example", "--device-plugins-dir", str(_symlink(short_tmp))])
    assert exited.value.code == 0
    assert len(run_host.calls) == 1


def test_run_hands_the_composition_root_everything(
    fake_site: Path,
    short_tmp: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logging_calls: list[tuple[Any, ...]],
    run_host: Served,
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("health_interval: 1\n")
    argv = ["run", "--config", str(config_file), "--device-plugins-dir", str(short_tmp)]
    argv += ["--backend", "good", "--backend", "broken", "--hook-timeout", "2.5", "--log-format", "json"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    [call] = run_host.calls
    config = call["config"]
    assert (config.device_plugins_dir, config.health_interval, config.hook_timeout) == (short_tmp, 1, 2.5)
    assert call["backends"] == ["good"]
    assert list(call["failed_backends"]) == ["broken"]
    assert "ModuleNotFoundError" in call["failed_backends"]["broken"]
    assert call["config_file"] == config_file
    assert logging_calls == [("info", "json")]
    # a reload reads the same file, the environment as it is then, and the same flags
    assert call["reload_config"]() == config
    config_file.write_text("health_interval: 3\nhook_timeout: 9\n")
    monkeypatch.setenv("DEVICEHOST_REDISCOVER_INTERVAL", "4")
    reloaded = call["reload_config"]()
    assert (reloaded.health_interval, reloaded.rediscover_interval, reloaded.hook_timeout) == (3, 4, 2.5)


def test_run_follows_the_config_file_named_by_the_environment(
    short_tmp: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logging_calls: list[tuple[Any, ...]],
    run_host: Served,
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(f"device_plugins_dir: {short_tmp}\nenabled_backends: [example]\n")
    monkeypatch.setenv("DEVICEHOST_CONFIG", str(config_file))
    with pytest.raises(SystemExit):
        main(["run"])
    [call] = run_host.calls
    assert call["config_file"] == config_file
    assert call["backends"] == ["example"]


def test_simulate_skips_the_socket_dir_checks(
    logging_calls: list[tuple[Any, ...]],
    run_host: Served,
    run_simulated: Served,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEVICEHOST_DEVICE_PLUGINS_DIR", "/nonexistent")
    with pytest.raises(SystemExit) as exited:
        main(["run", "--simulate-kubelet", "--backend", "example"])
    assert exited.value.code == 0
    assert run_host.calls == []
    [call] = run_simulated.calls
    assert call["backends"] == ["example"]
    assert call["failed_backends"] == {}
    assert call["config_file"] is None
    assert call["reload_config"]() == call["config"]
    assert call["kubernetes_version"] is None  # the stand-ins' default: 1.35


def test_simulate_takes_a_kubernetes_version_and_nothing_else_does(
    run_host: Served, run_simulated: Served, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--simulate-kubelet", "--kubernetes-version", "1.37", "--backend", "example"])
    assert exited.value.code == 0
    assert run_simulated.calls[0]["kubernetes_version"] == "1.37"
    assert main(["run", "--kubernetes-version", "1.36", "--backend", "example"]) == 2
    assert "--kubernetes-version applies only with --simulate-kubelet" in capfd.readouterr().err
    assert main(["run", "--simulate-kubelet", "--kubernetes-version", "1.33", "--backend", "example"]) == 2
    assert "Kubernetes version '1.33' is not one of 1.34, 1.35, 1.36, 1.37" in capfd.readouterr().err
    assert run_host.calls == []
