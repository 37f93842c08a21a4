"""Signals to ``devicehost run``: SIGTERM during start, Register, an Allocate burst and a reload;
SIGKILL and a restart next to another live host.

Fake backends are pip-installed into a site dir on PYTHONPATH; each records its hook calls as
``<pid> <backend> <action> <resource>`` lines in a file, so the test sees every start and stop.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cdi_guard import child_environ
from faultkit import Ledger, wait_until
from hostfakes import install_fake_distribution

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(120)

GRACE = 5.0
"""Seconds a signalled host may take to exit."""
CLEAN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
"""How a call the stopping host did not complete may end."""

BACKEND = """
import os
import time

import devicehost

SPEC = SPEC_VALUE


def _record(action, what=""):
    with open(os.environ["DH_SIGNALS_RECORD"], "a") as out:
        out.write(f"{os.getpid()} {SPEC['name']} {action} {what}\\n")


@devicehost.hookimpl
def devicehost_configure(settings):
    _record("configure", settings.get("round", 0))
    time.sleep(settings.get("configure_delay", 0))


@devicehost.hookimpl
def devicehost_discover():
    devices = tuple(devicehost.Device(f"d{n}") for n in range(4))
    return [devicehost.Resource(name, devices) for name in SPEC["resources"]]


@devicehost.hookimpl
def devicehost_start(resource):
    _record("start-begin", resource)
    time.sleep(SPEC.get("start_delay", 0))
    _record("start", resource)


@devicehost.hookimpl
def devicehost_stop(resource):
    _record("stop", resource)


@devicehost.hookimpl
def devicehost_allocate(device_ids):
    time.sleep(SPEC.get("allocate_delay", 0))
    return devicehost.ContainerAllocation(envs={"IDS": ",".join(device_ids)})
"""


class Daemon:
    """A ``devicehost run`` subprocess; a thread collects its JSON log lines as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devicehost", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"event": "(not JSON)", "raw": raw}
            self.lines.append(line if isinstance(line, dict) else {"event": "(not an object)", "raw": raw})

    def seen(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            line
            for line in list(self.lines)
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(self, event: str, timeout: float = 15, **fields: Any) -> dict[str, Any]:  # noqa: ASYNC109
        await wait_until(
            lambda: bool(self.seen(event, **fields)) or self.proc.poll() is not None,
            timeout,
            f"log {event!r}",
        )
        found = self.seen(event, **fields)
        assert found, f"exited with {self.proc.returncode} before {event!r}: {self.lines[-5:]}"
        return found[0]

    async def signal(self, sig: int) -> tuple[int, float]:
        """Send ``sig``; the exit code and the seconds to exit (fails past the grace period)."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = await asyncio.to_thread(self.proc.wait, GRACE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {GRACE} s after {signal.Signals(sig).name}") from None
        elapsed = time.monotonic() - started
        self._reader.join(5)
        return code, elapsed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Record:
    """The hook calls the fake backends wrote down."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[tuple[int, str, str, str]]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            pid, backend, action, what = [*line.split(" ", 3), ""][:4]
            found.append((int(pid), backend, action, what))
        return found

    def count(self, action: str, what: str | None = None, pid: int | None = None) -> int:
        return sum(
            a == action and (what is None or w == what) and (pid is None or p == pid)
            for p, _, a, w in self.entries()
        )

    def assert_stopped_once_each(self, pid: int) -> Counter[str]:
        """Every resource process ``pid`` started was stopped exactly once; the started ones."""
        started = Counter(w for p, _, a, w in self.entries() if p == pid and a == "start")
        stopped = Counter(w for p, _, a, w in self.entries() if p == pid and a == "stop")
        assert stopped == started, (started, stopped)
        assert set(started.values()) <= {1}, started
        return started


@pytest.fixture
def record(tmp_path: Path) -> Record:
    return Record(tmp_path / "record.txt")


@pytest.fixture
def site(tmp_path: Path, record: Record) -> tuple[Path, dict[str, str]]:
    """A site dir for fake backends and the environment that puts it on PYTHONPATH."""
    directory = tmp_path / "site"
    env = child_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *sys.path])
    env["DH_SIGNALS_RECORD"] = str(record.path)
    return directory, env


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.close()


def install(site: tuple[Path, dict[str, str]], name: str, resources: list[str], **spec: float) -> None:
    """Install backend ``name`` serving ``resources`` (4 devices each); ``spec`` sets its delays."""
    source = BACKEND.replace("SPEC_VALUE", repr({"name": name, "resources": resources, **spec}))
    install_fake_distribution(site[0], f"devicehost-{name}", f"dh_{name}", source, f"{name} = dh_{name}")


def start(site: tuple[Path, dict[str, str]], daemons: list[Daemon], plugin_dir: Path, *args: str) -> Daemon:
    daemon = Daemon(["--device-plugins-dir", str(plugin_dir), *args], site[1])
    daemons.append(daemon)
    return daemon


def our_sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("devicehost-*.sock"))


def socket_of(directory: Path, resource: str) -> Path:
    prefix = "devicehost-" + resource.replace("/", "_")
    found = [p for p in directory.glob(f"{prefix}-*.sock")]
    assert len(found) == 1, (resource, our_sockets(directory))
    return found[0]


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        code = probe.connect_ex(str(path))
    assert code in (0, errno.ECONNREFUSED), os.strerror(code)
    return code == 0


async def test_sigterm_while_start_hooks_run(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    site: tuple[Path, dict[str, str]],
    record: Record,
    daemons: list[Daemon],
    ledger: Ledger,
) -> None:
    """SIGTERM while two slow start hooks run: they finish, each resource is stopped once, exit 0."""
    names = ["slow.example.com/a", "slow.example.com/b"]
    install(site, "slowstart", names, start_delay=1.0)
    daemon = start(site, daemons, plugin_dir, "--backend", "slowstart")
    await wait_until(lambda: record.count("start-begin") == 2, 15, "both start hooks to run")
    assert record.count("start") == 0
    code, _ = await daemon.signal(signal.SIGTERM)
    assert code == 0, daemon.lines[-5:]
    assert our_sockets(plugin_dir) == []
    assert sorted(record.assert_stopped_once_each(daemon.proc.pid)) == names
    ledger.add("SIGTERMs survived cleanly: during start hooks")


async def test_sigterm_while_register_is_in_flight(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    site: tuple[Path, dict[str, str]],
    record: Record,
    daemons: list[Daemon],
    ledger: Ledger,
) -> None:
    """The kubelet holds the Register call when SIGTERM comes: exit 0 at once, stop called once."""
    entered = asyncio.Event()
    release = asyncio.Event()
    original = kubelet._register

    async def held(request: api_pb2.RegisterRequest) -> str | None:
        entered.set()
        await asyncio.wait_for(release.wait(), 20)
        return await original(request)

    kubelet._register = held  # type: ignore[method-assign]
    await kubelet.restart()  # the new registration servicer takes the held handler
    install(site, "plain", ["plain.example.com/p"])
    daemon = start(site, daemons, plugin_dir, "--backend", "plain")
    try:
        await asyncio.wait_for(entered.wait(), 15)
        code, _ = await daemon.signal(signal.SIGTERM)
    finally:
        release.set()
    assert code == 0, daemon.lines[-5:]
    assert our_sockets(plugin_dir) == []
    assert daemon.seen("registered") == []
    assert sorted(record.assert_stopped_once_each(daemon.proc.pid)) == ["plain.example.com/p"]
    ledger.add("SIGTERMs survived cleanly: during a Register call")


async def test_sigterm_during_an_allocate_burst(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    site: tuple[Path, dict[str, str]],
    record: Record,
    daemons: list[Daemon],
    ledger: Ledger,
    long_mode: bool,
) -> None:
    """Eight clients allocating when SIGTERM comes: every call completes or ends UNAVAILABLE or
    CANCELLED, none hangs; exit 0, no socket left, stop called once (ten hosts in long mode)."""
    name = "busy.example.com/w"
    install(site, "busy", [name], allocate_delay=0.02)
    for _ in range(10 if long_mode else 1):
        daemon = start(site, daemons, plugin_dir, "--backend", "busy")
        in_flight = await allocate_burst_then_sigterm(kubelet, plugin_dir, name, daemon)
        assert our_sockets(plugin_dir) == []
        assert record.assert_stopped_once_each(daemon.proc.pid) == Counter({name: 1})
        ledger.add("SIGTERMs survived cleanly: during an Allocate burst")
        ledger.add("Allocates in flight at a SIGTERM", len(in_flight))
        ledger.add("Allocates in flight at a SIGTERM that completed", in_flight.count(grpc.StatusCode.OK))


async def allocate_burst_then_sigterm(
    kubelet: KubeletStandIn, plugin_dir: Path, name: str, daemon: Daemon
) -> list[grpc.StatusCode]:
    """Eight clients allocate until the host is gone; SIGTERM it mid-burst; the in-flight outcomes."""
    await kubelet.wait_for_resource(name, healthy=4)
    path = socket_of(plugin_dir, name)
    calls: list[tuple[float, float, grpc.StatusCode]] = []

    async def client(n: int) -> None:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            for i in range(5000):
                ids = [f"d{(n + i) % 4}"]
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                )
                began = time.monotonic()
                try:
                    response = await stub.Allocate(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    calls.append((began, time.monotonic(), exc.code()))
                    return
                calls.append((began, time.monotonic(), grpc.StatusCode.OK))
                assert dict(response.container_responses[0].envs) == {"IDS": ids[0]}

    clients = [asyncio.create_task(client(n)) for n in range(8)]
    await wait_until(lambda: len(calls) >= 40 or any(t.done() for t in clients), 15, "40 Allocates")
    assert not any(t.done() for t in clients), Counter(c.name for _, _, c in calls)
    signalled = time.monotonic()
    code, _ = await daemon.signal(signal.SIGTERM)
    await asyncio.wait_for(asyncio.gather(*clients), 15)
    assert code == 0, daemon.lines[-5:]
    outcomes = Counter(c.name for _, _, c in calls)
    assert outcomes["DEADLINE_EXCEEDED"] == 0, outcomes  # nothing hung
    assert {c for _, _, c in calls} <= CLEAN | {grpc.StatusCode.OK}, outcomes
    assert sum(c in CLEAN for _, _, c in calls) == 8, outcomes  # each client's last call, after the exit
    in_flight = [c for began, ended, c in calls if began < signalled < ended]
    assert in_flight, "no Allocate was in flight at the SIGTERM"
    return in_flight


@pytest.mark.parametrize("moment", ["right after SIGHUP", "while the reload configures"])
async def test_sigterm_during_a_reload(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    site: tuple[Path, dict[str, str]],
    record: Record,
    daemons: list[Daemon],
    ledger: Ledger,
    tmp_path: Path,
    moment: str,
) -> None:
    """SIGHUP after a config edit that drops a backend and slows the other's configure, then
    SIGTERM: exit 0, no socket left, each started resource stopped once (the dropped one too)."""
    install(site, "keep", ["keep.example.com/k"])
    install(site, "drop", ["drop.example.com/d"])
    config = tmp_path / "config.yaml"

    def write(settings: dict[str, Any]) -> None:
        fresh = tmp_path / "config.yaml.new"
        fresh.write_text(yaml.safe_dump(settings))
        fresh.replace(config)  # at once, as a ConfigMap update does

    write({"enabled_backends": ["keep", "drop"], "backends": {"keep": {"round": 1}}})
    daemon = start(site, daemons, plugin_dir, "--config", str(config))
    await kubelet.wait_for_resource("keep.example.com/k", healthy=4)
    await kubelet.wait_for_resource("drop.example.com/d", healthy=4)
    write({"enabled_backends": ["keep"], "backends": {"keep": {"round": 2, "configure_delay": 1.5}}})
    daemon.proc.send_signal(signal.SIGHUP)
    if moment == "while the reload configures":
        await wait_until(lambda: record.count("configure", "2") == 1, 10, "the reload to configure")
        assert record.count("stop", "drop.example.com/d") == 1  # withdrawn by the reload
    code, _ = await daemon.signal(signal.SIGTERM)
    assert code == 0, daemon.lines[-5:]
    assert our_sockets(plugin_dir) == []
    started = record.assert_stopped_once_each(daemon.proc.pid)
    assert sorted(started) == ["drop.example.com/d", "keep.example.com/k"]
    assert Counter(line["resource"] for line in daemon.seen("withdrawn")) == started
    ledger.add(f"SIGTERMs survived cleanly: {moment}")


async def test_sigkill_then_restart_next_to_a_live_host(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    site: tuple[Path, dict[str, str]],
    record: Record,
    daemons: list[Daemon],
    ledger: Ledger,
) -> None:
    """Two hosts share the dir; one is SIGKILLed and started again: the new one removes only the
    dead host's socket, the live host's socket stays and keeps serving, and both stop cleanly."""
    install(site, "alpha", ["alpha.example.com/a"])
    install(site, "beta", ["beta.example.com/b"])
    first = start(site, daemons, plugin_dir, "--backend", "alpha")
    second = start(site, daemons, plugin_dir, "--backend", "beta")
    await kubelet.wait_for_resource("alpha.example.com/a", healthy=4)
    await kubelet.wait_for_resource("beta.example.com/b", healthy=4)
    dead, live = socket_of(plugin_dir, "alpha.example.com/a"), socket_of(plugin_dir, "beta.example.com/b")
    live_inode = live.stat().st_ino
    first.proc.kill()
    assert await asyncio.to_thread(first.proc.wait, GRACE) == -signal.SIGKILL
    assert dead.exists()
    assert not listening(dead)
    third = start(site, daemons, plugin_dir, "--backend", "alpha")
    cleaned = await third.wait_for("removed stale sockets of an earlier host")
    assert cleaned["sockets"] == [dead.name]
    await wait_until(lambda: kubelet.registrations("alpha.example.com/a") == 2, 15, "alpha registered again")
    await kubelet.wait_for_resource("alpha.example.com/a", healthy=4)
    assert not dead.exists()
    assert live.stat().st_ino == live_inode
    assert listening(live)
    assert kubelet.registrations("beta.example.com/b") == 1
    for resource in ("alpha.example.com/a", "beta.example.com/b"):
        result = await kubelet.allocate(resource, 2)
        assert dict(result.response.container_responses[0].envs) == {"IDS": ",".join(result.device_ids)}
    for daemon in (second, third):
        code, _ = await daemon.signal(signal.SIGTERM)
        assert code == 0, daemon.lines[-5:]
    assert our_sockets(plugin_dir) == []
    assert record.count("start", pid=first.proc.pid) == 1
    assert record.count("stop", pid=first.proc.pid) == 0  # SIGKILL: no chance to stop
    assert record.assert_stopped_once_each(second.proc.pid) == Counter({"beta.example.com/b": 1})
    assert record.assert_stopped_once_each(third.proc.pid) == Counter({"alpha.example.com/a": 1})
    ledger.add("SIGKILLed hosts restarted next to a live one")
    ledger.add("stale sockets of a SIGKILLed host cleaned, live ones kept")
