"""The log of a real ``devicehost run`` process tells what happened, one JSON object a line.

Off a terminal every line is JSON, gRPC C-core's own lines included; at info level a reader sees
which backends loaded (distribution, version, resources), each resource served and registered
(``backend=`` on every line about a resource, the simulated kubelet's marked as its own), and
one closing ``stopped`` line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cdi_guard import child_environ
from waiting import eventually

from devicehost.host import logs
from devicehost.testing.host import HostProcess, host_process
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(90)


def child_env(**extra: str) -> dict[str, str]:
    env = child_environ("GRPC_")
    return {**env, **extra}


def not_json(child: HostProcess) -> list[str]:
    """Every line the process wrote, on stdout or stderr, that is not one JSON object."""
    bad = [str(line["raw"]) for line in child.lines if "raw" in line]
    for text in child.stderr.splitlines():
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            bad.append(text)
    return bad


def resource_lines(child: HostProcess) -> list[dict[str, Any]]:
    return [line for line in child.lines if "resource" in line]


async def test_grpc_core_lines_join_the_json_log_across_a_kubelet_restart(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    # GRPC_VERBOSITY=INFO: the user asked gRPC for its info lines; they must come as JSON too
    async with host_process(plugin_dir, ["example"], env=child_env(GRPC_VERBOSITY="INFO")) as child:
        await kubelet.wait_for_resource("example.com/widget", healthy=4)
        await kubelet.restart()  # the host's kubelet.sock channel gets a GOAWAY
        await kubelet.wait_for_resource("example.com/widget", healthy=4)
        await eventually(
            lambda: sum(line.get("event") == "registered" for line in child.lines) >= 2,
            "the host registered again after the restart",
        )
        assert await child.stop() == 0
    core = [line for line in child.lines if line.get("logger") == "grpc-core"]
    # C-core's own lines (its INFO-level notice at start; the GOAWAY of the restart when the
    # host's channel was connected at that moment) arrive as log lines, not as plain text
    assert core
    assert all(line["level"] in ("debug", "info", "warning", "error", "critical") for line in core)
    assert not_json(child) == []


async def test_the_info_log_tells_the_story_without_grpc_chatter_at_debug(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    async with host_process(plugin_dir, ["example"], args=["--log-level", "debug"], env=child_env()) as child:
        await kubelet.wait_for_resource("example.com/widget", healthy=4)
        await child.wait_for_log("registered", resource="example.com/widget")
        await kubelet.allocate("example.com/widget", 1)
        assert await child.stop() == 0
    loaded = [line for line in child.lines if line.get("event") == "backend loaded"]
    assert len(loaded) == 1
    assert loaded[0]["backend"] == "example"
    assert loaded[0]["distribution"] == "devicehost-example"
    assert loaded[0]["version"]
    assert loaded[0]["resources"] == ["example.com/widget"]
    assert [line["backend"] for line in resource_lines(child)] == ["example"] * len(resource_lines(child))
    assert child.lines[-1]["event"] == "stopped"
    stopped = child.lines[-1]
    assert (stopped["backends"], stopped["resources"], stopped["devices"]) == (["example"], 1, 4)
    assert (stopped["registrations"], stopped["allocations"]) == (1, 1)
    chatter = [line for line in child.lines if line.get("logger", "").startswith(("grpc", "asyncio"))]
    assert chatter == []  # no "Loaded running loop", no C-core lines: nobody asked gRPC for them
    assert not_json(child) == []


@asynccontextmanager
async def simulated(*args: str) -> AsyncIterator[HostProcess]:
    command = [sys.executable, "-m", "devicehost", "run", "--simulate-kubelet", "--log-format", "json"]
    process = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    child = HostProcess(process)
    try:
        yield child
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_simulated_kubelets_lines_are_its_own_and_its_shutdown_view_no_fault() -> None:
    async with simulated("--backend", "example") as child:
        await child.wait_for_log("sample allocation", resource="example.com/widget")
        assert await child.stop(signal.SIGINT) == 0
    kubelet_lines = [line for line in child.lines if line.get("component") == "simulated-kubelet"]
    host_lines = [line for line in child.lines if "component" not in line]
    registered = [line for line in child.lines if line.get("event") == "registered"]
    # one line each from the host and from the simulated kubelet, told apart by component=
    assert sorted(line.get("component", "host") for line in registered) == ["host", "simulated-kubelet"]
    assert all(line["backend"] == "example" for line in kubelet_lines if "resource" in line)
    assert all(line["backend"] == "example" for line in host_lines if "resource" in line)
    views = [line for line in kubelet_lines if line["event"].startswith("kubelet view")]
    before_stop = [line for line in views if line["event"] == "kubelet view"]
    assert before_stop
    assert all(line["allocatable"] == 4 for line in before_stop)
    assert [line["event"] for line in views if line["allocatable"] == 0] == [
        "kubelet view: withdrawn by the stopping host"
    ]
    assert child.lines[-1]["event"] == "stopped"
    assert not_json(child) == []


def test_native_lines_become_log_records(caplog: pytest.LogCaptureFixture) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"I1123 09:19:04.182047    2531 chttp2_transport.cc:1403] unix:/x: Got goaway\n")
    os.write(write_end, b"E1123 09:19:05.000001 2531 server.cc:10] bad\nsomething else\n")
    os.close(write_end)
    with caplog.at_level(logging.DEBUG):
        logs.log_native_lines(read_end)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("grpc-core", "INFO", "unix:/x: Got goaway [chttp2_transport.cc:1403]"),
        ("grpc-core", "ERROR", "bad [server.cc:10]"),
        ("stderr", "ERROR", "something else"),
    ]


@pytest.mark.parametrize("log_format", ["json", "console"])
async def test_no_grpc_core_line_at_default_verbosity_over_kubelet_restarts(
    kubelet: KubeletStandIn, plugin_dir: Path, log_format: str
) -> None:
    """Nobody asked gRPC for more (no GRPC_VERBOSITY, no GRPC_TRACE): C-core's INFO lines (its
    ``Got goaway`` at every restart) appear nowhere, neither as log lines nor raw on stderr."""
    args = ["--log-format", log_format]
    async with host_process(plugin_dir, ["example"], args=args, env=child_env()) as child:
        await kubelet.wait_for_resource("example.com/widget", healthy=4)
        for _ in range(3):
            await kubelet.restart()  # the host's kubelet.sock channel gets a GOAWAY each time
            await kubelet.wait_for_resource("example.com/widget", healthy=4)
        await eventually(
            lambda: sum("registered" in str(line.get("event", line.get("raw"))) for line in child.lines) >= 4,
            "the host registered again after every restart",
        )
        assert await child.stop() == 0
    text = [str(line.get("raw", "")) for line in child.lines] + child.stderr.splitlines()
    assert [line for line in text if logs._NATIVE_LINE.match(line.strip()) or ".cc:" in line] == []
    assert [line for line in child.lines if line.get("logger") == "grpc-core"] == []


RAISING_BACKEND = """
import devicehost

def probe_the_driver():
    raise RuntimeError("driver gone")

@devicehost.hookimpl
def devicehost_discover():
    probe_the_driver()

@devicehost.hookimpl
def devicehost_allocate(device_ids):
    return devicehost.ContainerAllocation()
"""


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_a_hook_exception_carries_its_traceback_at_debug_level(
    kubelet: KubeletStandIn, plugin_dir: Path, tmp_path: Path, level: str
) -> None:
    from hostfakes import install_fake_distribution

    site = tmp_path / "site"
    install_fake_distribution(
        site, "devicehost-raising", "dh_raising", RAISING_BACKEND, "raising = dh_raising"
    )
    env = child_env(PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    async with host_process(plugin_dir, ["raising"], args=["--log-level", level], env=env) as child:
        await child.wait_for_log("discovery failed, keeping this backend's resources as they are")
        assert await child.stop() == 0
    failed = [line for line in child.lines if line.get("event", "").startswith("discovery failed")]
    assert "RuntimeError: driver gone" in failed[0]["error"]  # the one line, at every level
    raised = [line for line in child.lines if line.get("event") == "hook raised"]
    if level == "info":
        assert raised == []
        return
    assert raised[0]["backend"] == "raising"
    assert raised[0]["hook"] == "devicehost_discover"
    frames = [frame["name"] for frame in raised[0]["exception"][0]["frames"]]
    assert "probe_the_driver" in frames  # where it raised, in the backend's own code
