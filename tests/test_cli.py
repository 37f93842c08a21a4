"""The ``devicehost`` command as a user runs it: subprocesses, signals, JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cdi_guard import child_environ
from hostfakes import install_fake_distribution, install_test_backends

from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(60)

SLOW_STOP_BACKEND = """
import time
import devicehost

@devicehost.hookimpl
def devicehost_discover():
    return [devicehost.Resource("slow.example.com/stop", (devicehost.Device("s0"),))]

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()

@devicehost.hookimpl
def devicehost_stop(resource):
    time.sleep(30)
"""


class Daemon:
    """A ``devicehost`` subprocess whose JSON log lines are collected by a reader thread.

    The pipe is always drained: a daemon blocked on a full stdout pipe (asyncio's debug mode,
    on under PYTHONDEVMODE, logs every slow callback) would neither answer nor exit.
    """

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devicehost", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: list[dict[str, Any]] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._new_line:
                self.lines.append(json.loads(raw))
                self._new_line.notify_all()

    def wait_for(self, event: str, timeout: float = 15, **fields: Any) -> dict[str, Any]:
        """Wait for a log line with this event (and fields); fail with what was seen."""

        def found() -> dict[str, Any] | None:
            for line in self.lines:
                if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                    return line
            return None

        with self._new_line:
            self._new_line.wait_for(lambda: found() is not None or not self._reader.is_alive(), timeout)
            line = found()
        if line is None:
            raise AssertionError(
                f"no {event!r} {fields} in the log; saw {[x.get('event') for x in self.lines]}"
            )
        return line

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        """Signal the daemon, wait for its exit, and for the rest of its log."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a devicehost subprocess: fake backends installed, no DEVICEHOST_ vars."""
    site = tmp_path / "site"
    install_test_backends(site)
    clean = child_environ()
    clean["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    return clean


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.close()


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devicehost", *args], capture_output=True, text=True, env=env, timeout=30
    )


async def test_sigterm_stops_cleanly_and_leaves_no_socket(
    kubelet: KubeletStandIn, plugin_dir: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(
        ["run", "--device-plugins-dir", str(plugin_dir), "--backend", "good", "--backend", "example"], env
    )
    daemons.append(daemon)
    await kubelet.wait_for_resource("good.example.com/thing", healthy=2)
    await kubelet.wait_for_resource("example.com/widget", healthy=4)
    assert len([p for p in plugin_dir.iterdir() if p.name.startswith("devicehost-")]) == 2
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 5
    assert sorted(p.name for p in plugin_dir.iterdir()) == ["kubelet.sock"]
    withdrawn = {line["resource"] for line in daemon.lines if line["event"] == "withdrawn"}
    assert withdrawn == {"good.example.com/thing", "example.com/widget"}


async def test_broken_backend_next_to_a_good_one(
    kubelet: KubeletStandIn, plugin_dir: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(
        ["run", "--device-plugins-dir", str(plugin_dir), "--disable", "nvidia", "--disable", "hostdev"], env
    )
    daemons.append(daemon)
    failure = daemon.wait_for("backend failed to load", backend="broken")
    assert "ModuleNotFoundError" in failure["reason"]
    assert failure["distribution"] == "devicehost-broken"
    assert failure["level"] == "error"
    await kubelet.wait_for_resource("good.example.com/thing", healthy=2)
    result = await kubelet.allocate("good.example.com/thing", 1)
    assert dict(result.response.container_responses[0].envs) == {"THINGS": "t0"}
    registered = daemon.wait_for("registered", resource="good.example.com/thing")
    assert registered["backend"] == "good"
    assert daemon.stop() == 0


async def test_second_signal_forces_the_exit(
    kubelet: KubeletStandIn, plugin_dir: Path, env: dict[str, str], daemons: list[Daemon], tmp_path: Path
) -> None:
    site = tmp_path / "slow-site"
    install_fake_distribution(site, "devicehost-slow", "dh_slow", SLOW_STOP_BACKEND, "slow = dh_slow")
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    daemon = Daemon(
        ["run", "--device-plugins-dir", str(plugin_dir), "--backend", "slow", "--hook-timeout", "20"], env
    )
    daemons.append(daemon)
    await kubelet.wait_for_resource("slow.example.com/stop", healthy=1)
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.wait_for("stopping", signal="SIGTERM")
    started = time.monotonic()
    assert daemon.stop(signal.SIGINT, timeout=5) == 1
    assert time.monotonic() - started < 3
    daemon.wait_for("second signal, exiting without cleaning up")


def test_simulate_kubelet_shows_registration_and_an_allocation(
    env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(["run", "--simulate-kubelet", "--backend", "example"], env)
    daemons.append(daemon)
    daemon.wait_for("registered", resource="example.com/widget", backend="example")
    view = daemon.wait_for("kubelet view", resource="example.com/widget")
    assert view["allocatable"] == 4
    sample = daemon.wait_for("sample allocation", resource="example.com/widget")
    assert sample["response"]["envs"] == {"EXAMPLE_WIDGETS": sample["devices"][0]}
    assert sample["response"]["devices"][0]["hostPath"] == "/dev/null"
    assert daemon.stop(signal.SIGINT) == 0


def test_simulate_kubelet_serves_a_dra_backend_and_shows_a_sample_claim(
    env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(["run", "--simulate-kubelet", "--backend", "dra-example", "--node-name", "node-7"], env)
    daemons.append(daemon)
    published = daemon.wait_for("ResourceSlice published", driver="gpu.example.com")
    assert published["devices"] == 8
    prepared = daemon.wait_for("sample claim prepared", driver="gpu.example.com")
    (device,) = prepared["devices"]
    gpu = device.rpartition("/")[2]
    assert prepared["env"][f"GPU_DEVICE_{gpu.removeprefix('gpu-')}"] == gpu
    assert prepared["env"]["DRA_ADMIN_ACCESS"] == "false"
    assert prepared["env"]["KUBERNETES_NODE_NAME"] == "node-7"  # --node-name reaches the backend
    assert prepared["cdi_devices"][0].startswith("gpu.example.com/claim-")
    daemon.wait_for("sample claim unprepared", driver="gpu.example.com")
    assert daemon.stop(signal.SIGINT) == 0


def test_simulate_kubelet_prepares_its_sample_claim_with_the_backends_example_config(
    env: dict[str, str], daemons: list[Daemon]
) -> None:
    """The x1 test backend's claim config model offers {mode: graphics, clockMhz: 1200} first:
    the sample claim carries it, and the container's env shows the backend applied it."""
    daemon = Daemon(["run", "--simulate-kubelet", "--backend", "x1"], env)
    daemons.append(daemon)
    prepared = daemon.wait_for("sample claim prepared", driver="x1.example.com")
    assert prepared["config"] == {"kind": "X1Config", "mode": "graphics", "clockMhz": 1200}
    assert (prepared["env"]["X1_MODE"], prepared["env"]["X1_CLOCK_MHZ"]) == ("graphics", "1200")
    daemon.wait_for("sample claim unprepared", driver="x1.example.com")
    assert daemon.stop(signal.SIGINT) == 0


def test_simulate_kubelet_shows_binding_conditions_and_the_claim_status(
    env: dict[str, str], daemons: list[Daemon]
) -> None:
    settings = '{"dra-example": {"num_gpus": 1, "binding_conditions": true, "device_status": true}}'
    daemon = Daemon(
        ["run", "--simulate-kubelet", "--backend", "dra-example", "--backend-settings", settings], env
    )
    daemons.append(daemon)
    bound = daemon.wait_for("sample claim bound: its binding conditions are True", driver="gpu.example.com")
    (waited,) = bound["status_devices"]
    assert [(c["type"], c["status"], c["reason"]) for c in waited["conditions"]] == [
        ("BindingConditions", "True", "Ready")
    ]
    prepared = daemon.wait_for("sample claim prepared", driver="gpu.example.com")
    (status,) = prepared["status_devices"]
    assert status["data"]["model"] == "LATEST-GPU-MODEL"
    assert daemon.stop(signal.SIGINT) == 0


def test_backends_command_lists_status_and_resources(env: dict[str, str]) -> None:
    result = run_cli("backends", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    good = next(i for i, line in enumerate(lines) if line.startswith("good "))
    assert "(devicehost-good 1.2.3, dh_good)  loaded" in lines[good]
    assert lines[good + 1].strip() == "good.example.com/thing: 2 devices (2 healthy)"
    broken = next(line for line in lines if line.startswith("broken "))
    assert "FAILED: import of dh_broken failed (ModuleNotFoundError" in broken
    assert any(line.startswith("asyncy ") and "must be synchronous" in line for line in lines)


def test_unknown_backend_is_a_usage_error(env: dict[str, str]) -> None:
    result = run_cli("run", "--backend", "nosuch", "--device-plugins-dir", "/tmp", env=env)
    assert result.returncode == 2
    assert "unknown backend(s): nosuch (in enabled_backends); installed: " in result.stderr


def test_missing_device_plugins_dir_is_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    result = run_cli("run", "--backend", "good", "--device-plugins-dir", str(tmp_path / "nope"), env=env)
    assert result.returncode == 2
    assert f"device-plugins dir {tmp_path / 'nope'} does not exist" in result.stderr


def test_unwritable_device_plugins_dir_is_a_clear_error(env: dict[str, str]) -> None:
    unwritable = Path("/proc/1")
    if os.access(unwritable, os.W_OK):
        pytest.skip("no unwritable directory available to this user")
    result = run_cli("run", "--backend", "good", "--device-plugins-dir", str(unwritable), env=env)
    assert result.returncode == 2
    assert "device-plugins dir /proc/1 is not writable" in result.stderr


def test_malformed_config_file_names_the_key(env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("health_interval: soon\nnot_a_key: 1\n")
    result = run_cli("run", "--config", str(config), env=env)
    assert result.returncode == 2
    assert "health_interval: Input should be a valid number" in result.stderr
    assert "not_a_key: unknown key (valid keys: " in result.stderr


def test_symlinked_device_plugins_dir_is_refused_unless_allowed(env: dict[str, str], short_tmp: Path) -> None:
    real = short_tmp / "real"
    real.mkdir()
    link = short_tmp / "link"
    link.symlink_to(real)
    refused = run_cli("run", "--backend", "good", "--device-plugins-dir", str(link), env=env)
    assert refused.returncode == 2
    assert f"device-plugins dir {link} is a symlink (or lies under one) to {real}" in refused.stderr
    env["DEVICEHOST_ALLOW_SYMLINKED_DIRS"] = "true"
    daemon = Daemon(["run", "--backend", "good", "--device-plugins-dir", str(link)], env)
    try:
        daemon.wait_for("serving", resource="good.example.com/thing")
        assert daemon.stop() == 0
    finally:
        daemon.close()


def test_a_closed_stdout_does_not_stop_the_host_from_stopping(env: dict[str, str]) -> None:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "devicehost", "run", "--simulate-kubelet", "--backend", "example"],
        stdout=write_end,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(write_end)
    with os.fdopen(read_end) as log:
        assert json.loads(log.readline())["event"] == "kubelet started"
    # the reader is gone: every line the host writes from now on hits EPIPE
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def write(tmp_path: Path, text: str) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    return str(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backends: {not_installed: {}}\n", "unknown backend(s): not_installed (in backends); installed: "),
        ("enabled_backends: [acme]\n", "unknown backend(s): acme (in enabled_backends); installed: "),
        ("disabled_backends: exampel\n", "exampel (in disabled_backends, did you mean 'example'?)"),
        (
            "backends: {example: {numa_nodes: 0}}\n",
            "backends.example.numa_nodes: Input should be greater than 0",
        ),
        (
            "backends: {example: {resources: {example.com/widget: many}}}\n",
            "backends.example.resources.example.com/widget: Input should be a valid integer",
        ),
        (
            "backends: {example: {resourcez: {}}}\n",
            "backends.example.resourcez: unknown key, did you mean 'resources'?",
        ),
        (
            "rediscover_intervall: 3\n",
            "rediscover_intervall: unknown key, did you mean 'rediscover_interval'?",
        ),
        ("socket_mode: 660\n", "write octal as a string ('0660') or with a 0o prefix (0o660)"),
    ],
)
def test_config_check_and_run_refuse_the_same(
    env: dict[str, str], tmp_path: Path, text: str, message: str
) -> None:
    """What ``config check`` refuses, ``run`` refuses before serving anything, with the same words."""
    config = write(tmp_path, text)
    checked = run_cli("config", "check", config, env=env)
    assert checked.returncode == 2
    assert message in checked.stderr
    assert "Traceback" not in checked.stderr
    run = run_cli("run", "--simulate-kubelet", "--config", config, env=env)
    assert run.returncode == 2
    assert message in run.stderr
    assert "serving" not in run.stdout


def test_config_check_accepts_the_forms_people_write(env: dict[str, str], tmp_path: Path) -> None:
    config = write(
        tmp_path, "enabled_backends: example\nsocket_mode: '660'\nbackends: {example: {numa_nodes: 2}}\n"
    )
    result = run_cli("config", "check", config, env=env)
    assert (result.returncode, result.stdout) == (0, f"{config}: valid\n")
    shown = run_cli("config", "show", "--config", config, env=env)
    assert "enabled_backends:\n- example\n" in shown.stdout
    assert "socket_mode: '0660'" in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--disable", "acme"], "unknown backend(s): acme (in disabled_backends); installed: "),
        (["run", "--backend", "acme"], "unknown backend(s): acme (in enabled_backends); installed: "),
        (
            ["run", "--simulate-kubelet", "--device-plugins-dir", "/tmp"],
            "cannot apply with --simulate-kubelet",
        ),
        (["status", "--address", "nonsense"], "--address nonsense: must be HOST:PORT"),
        (["run", "--metrics-address", "nine"], "metrics_address: Value error, must be HOST:PORT"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(env: dict[str, str], args: list[str], message: str) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("devicehost: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_metrics_port_in_use_is_one_line(env: dict[str, str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = run_cli(
            "run", "--simulate-kubelet", "--backend", "good", "--metrics-address", address, env=env
        )
    assert result.returncode == 1  # README: 1, the host could not start
    assert result.stderr.startswith(f"devicehost: cannot listen on metrics address {address}: ")
    assert "address already in use" in result.stderr.lower()
    assert len(result.stderr.splitlines()) == 1
    assert "metrics address already in use" in readme_exit_codes()[result.returncode]


def readme_exit_codes() -> dict[int, str]:
    """README.md's exit codes: what each code's clause says, by code."""
    import re

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    paragraph = text.split("Exit codes: ", 1)[1].split(". Errors are one line", 1)[0]
    clauses = re.split(r"(?:^|[,;] )(\d) ", " ".join(paragraph.split()))
    return {int(code): what for code, what in zip(clauses[1::2], clauses[2::2], strict=True)}


def test_readme_exit_codes_are_the_code_s() -> None:
    from devicehost.host.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE

    codes = readme_exit_codes()
    assert sorted(codes) == sorted({EXIT_OK, EXIT_FAILED, EXIT_USAGE})
    assert "clean stop" in codes[EXIT_OK]
    assert "no backend could be loaded" in codes[EXIT_FAILED]
    assert "bad configuration" in codes[EXIT_USAGE]


def test_the_flags_the_readme_lists_exist(env: dict[str, str], short_tmp: Path) -> None:
    """--metrics-address and --registration-mode were in the README but not in the parser."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    args = ["run", "--backend", "good", "--device-plugins-dir", str(short_tmp)]
    daemon = Daemon([*args, "--registration-mode", "kubelet", "--metrics-address", address], env)
    try:
        assert daemon.wait_for("serving metrics and probes")["address"] == address
        daemon.wait_for("serving", resource="good.example.com/thing")
        assert daemon.stop() == 0
    finally:
        daemon.close()


def test_version_and_subcommand_usage(env: dict[str, str]) -> None:
    import devicehost

    assert run_cli("--version", env=env).stdout == f"devicehost {devicehost.__version__}\n"
    bogus = run_cli("run", "--bogus", env=env)
    assert bogus.returncode == 2
    assert bogus.stderr.startswith("usage: devicehost run ")
    assert bogus.stderr.endswith("devicehost run: error: unrecognized arguments: --bogus\n")


DISCOVERY_FAILS = """
import devicehost

@devicehost.hookimpl
def devicehost_discover():
    raise OSError("no such device: /dev/fpga0")

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()
"""


def test_config_check_refuses_a_backend_that_fails_to_load(env: dict[str, str], tmp_path: Path) -> None:
    """``run`` would exit 1 (no backend could be loaded): ``config check`` says why first."""
    config = write(tmp_path, "enabled_backends: [broken]\n")
    checked = run_cli("config", "check", config, env=env)
    assert checked.returncode == 1
    assert checked.stdout == ""
    assert checked.stderr.splitlines() == [
        f"devicehost: {config}: `run` would not serve:",
        "  backend broken: failed to load: import of dh_broken failed (ModuleNotFoundError: No module "
        "named 'no_such_driver_module'); the backend's package is broken: reinstall or upgrade it, "
        "or disable the backend",
    ]
    assert run_cli("run", "--simulate-kubelet", "--config", config, env=env).returncode == 1


def test_config_check_runs_discovery_and_refuses_a_failing_one(env: dict[str, str], tmp_path: Path) -> None:
    site = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    install_fake_distribution(site, "devicehost-fails", "dh_fails", DISCOVERY_FAILS, "fails = dh_fails")
    checked = run_cli("config", "check", write(tmp_path, "enabled_backends: [fails, good]\n"), env=env)
    assert checked.returncode == 2
    assert checked.stderr.splitlines()[1:] == [
        "  backends.fails: discovery failed, nothing would be served: backend 'fails' devicehost_discover "
        "raised OSError: no such device: /dev/fpga0"
    ]


def test_config_check_names_each_resource_run_would_refuse(env: dict[str, str], tmp_path: Path) -> None:
    text = "enabled_backends: [example]\nbackends: {example: {resources: {bad name: 2, example.com/widget: 2}}}\n"
    checked = run_cli("config", "check", write(tmp_path, text), env=env)
    assert checked.returncode == 2
    (problem,) = checked.stderr.splitlines()[1:]
    assert problem.startswith("  backends.example: resource 'bad name' would not be served: resource name ")
    assert "Traceback" not in checked.stderr
