"""A typed client of ``dpharness``: the real kubelet 1.32 device manager under JSON lines.

``dpharness`` and ``stubplugin`` come from a kubelet harness outside this repository;
``DEVICEHOST_KUBELET_PEER`` names the dir holding both executables. Everything here is
a real process on real unix sockets; the protocol is the peer's README::

    async with dpharness(peer, directory) as kubelet:
        await kubelet.wait("example.com/widget", 4)
        allocation = await kubelet.allocate("pod-1", "example.com/widget", 2)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PEER_ENV = "DEVICEHOST_KUBELET_PEER"
BINARIES = ("dpharness", "stubplugin")
REPLY_WITHIN = 30.0
"""Seconds any request may take beyond its own timeout: generous, the machine is shared."""


class HarnessError(Exception):
    """dpharness answered something that is not a reply, or exited."""


def peer_dir() -> tuple[Path | None, str]:
    """The dir holding ``dpharness`` and ``stubplugin``, or None and why it is not usable."""
    value = os.environ.get(PEER_ENV)
    if not value:
        return None, f"{PEER_ENV} is not set (a dir holding the dpharness and stubplugin executables)"
    missing = [name for name in BINARIES if not os.access(Path(value) / name, os.X_OK)]
    if missing:
        return None, f"{PEER_ENV}={value} has no executable {', '.join(missing)}"
    return Path(value), ""


@dataclass(frozen=True)
class Capacity:
    """``GetCapacity`` as the kubelet reports it; allocatable counts healthy devices."""

    capacity: dict[str, int]
    allocatable: dict[str, int]
    deleted: list[str]


@dataclass(frozen=True)
class Allocation:
    """What the kubelet built for one container, or where and why admission failed."""

    ok: bool
    device_ids: list[str] = field(default_factory=list)
    allocate_us: int = 0
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    stage: str = ""
    error: str = ""

    @classmethod
    def from_reply(cls, reply: dict[str, Any], resource: str) -> Allocation:
        if not reply["ok"]:
            return cls(False, stage=reply.get("stage", ""), error=reply.get("error", ""))
        return cls(
            True,
            device_ids=list(reply["device_ids"].get(resource, [])),
            allocate_us=int(reply["allocate_us"]),
            envs=dict(reply.get("envs") or {}),
            mounts=list(reply.get("mounts") or []),
            devices=list(reply.get("devices") or []),
            annotations=dict(reply.get("annotations") or {}),
            cdi_devices=[str(d) for d in reply.get("cdi_devices") or []],
        )


class DpHarness:
    """One running ``dpharness``; requests go one at a time."""

    def __init__(self, process: asyncio.subprocess.Process, directory: Path) -> None:
        self.process = process
        self.directory = directory
        self._lock = asyncio.Lock()

    async def request(self, op: str, extra_wait: float = 0.0, **fields: Any) -> dict[str, Any]:
        """Send one request line; its reply line, parsed."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        async with self._lock:
            self.process.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
            await self.process.stdin.drain()
            line = await asyncio.wait_for(self.process.stdout.readline(), REPLY_WITHIN + extra_wait)
        if not line:
            raise HarnessError(f"dpharness exited (status {self.process.returncode}) during {op!r}")
        reply = json.loads(line)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise HarnessError(f"dpharness answered {op!r} with {line!r}")
        return reply

    async def capacity(self) -> Capacity:
        reply = await self.request("capacity")
        return Capacity(dict(reply["capacity"]), dict(reply["allocatable"]), list(reply.get("deleted") or []))

    async def allocatable(self, resource: str) -> int:
        return (await self.capacity()).allocatable.get(resource, 0)

    async def allocate(self, pod: str, resource: str, count: int, container: str = "c0") -> Allocation:
        """Admit a pod of one container asking ``count`` of ``resource`` (Allocate, then run options)."""
        reply = await self.request("allocate", pod=pod, container=container, resource=resource, count=count)
        return Allocation.from_reply(reply, resource)

    async def release(self, pod: str) -> bool:
        """The pod ended: the kubelet frees its devices. Whether it was active."""
        return bool((await self.request("release", pod=pod))["was_active"])

    async def restart(self) -> int:
        """Stop the device manager, wipe the dir but the checkpoint, start again; microseconds."""
        reply = await self.request("restart")
        if not reply["ok"]:
            raise HarnessError(f"restart failed: {reply}")
        return int(reply["restart_us"])

    async def wait(self, resource: str, count: int, timeout: float = 20.0) -> tuple[bool, int, int]:  # noqa: ASYNC109
        """Until allocatable ``resource`` >= ``count``: (reached, allocatable, waited microseconds)."""
        reply = await self.request(
            "wait", extra_wait=timeout, resource=resource, count=count, timeout=timeout
        )
        return bool(reply["ok"]), int(reply["count"]), int(reply["waited_us"])

    async def until(
        self, check: Callable[[Capacity], bool], what: str, within: float = 20.0, every: float = 0.02
    ) -> Capacity:
        """Poll ``GetCapacity`` until ``check`` holds; fail with the last report after ``within`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not check(report := await self.capacity()):
            if loop.time() > deadline:
                raise AssertionError(f"not true after {within} s: {what}; the kubelet reports {report}")
            await asyncio.sleep(every)
        return report

    async def probe(self, socket: Path, devices: list[str], n: int) -> dict[str, Any]:
        """Time ``n`` raw Allocate RPCs on a plugin socket, dialled as the kubelet's client does."""
        return await self.request("probe", socket=str(socket), devices=devices, n=n)

    async def quit(self) -> None:
        await self.request("quit")


async def _stop(process: asyncio.subprocess.Process, within: float = 10.0) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), within)
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def dpharness(
    peer: Path, directory: Path, plugins_registry: Path | None = None, log: Path | None = None
) -> AsyncIterator[DpHarness]:
    """A ``dpharness`` serving ``directory/kubelet.sock`` (and watching ``plugins_registry``)."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [str(peer / "dpharness"), "--dir", str(directory)]
    if plugins_registry is not None:
        plugins_registry.mkdir(parents=True, exist_ok=True)
        argv += ["--plugins-registry", str(plugins_registry)]
    log_path = log or directory.parent / f"{directory.name}-dpharness.log"
    with log_path.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), REPLY_WITHIN)
        if json.loads(ready or b"{}").get("ok") is not True:
            raise HarnessError(f"dpharness did not start: {ready!r}; see {log_path}")
        yield DpHarness(process, directory)
    finally:
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(OSError, HarnessError, TimeoutError, ValueError):
                await DpHarness(process, directory).quit()
        await _stop(process)


@contextlib.asynccontextmanager
async def stubplugin(
    peer: Path, directory: Path, resource: str, devices: int, *options: str, socket_name: str = ""
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The Go reference plugin (the kubelet's own stub) serving ``resource`` into ``directory``.

    :param options: any of ``--fast-watch``, ``--preferred``, ``--prestart``.
    """
    argv = [str(peer / "stubplugin"), "--dir", f"{directory}/", "--resource", resource]
    argv += ["--devices", str(devices), *options]
    if socket_name:
        argv += ["--socket-name", socket_name]
    with (directory.parent / f"{directory.name}-stub.log").open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stderr=stderr)
    try:
        yield process
    finally:
        await _stop(process)
