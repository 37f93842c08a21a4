"""Server processes under test (the host, the bare baseline) and what /proc says about them."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
DEVICEHOST = Path(sys.executable).parent / "devicehost"
EXAMPLE_ENV = "DEVICEHOST_EXAMPLE_RESOURCES"
STOP_WAIT = 10.0


def compile_sources() -> None:
    """Write the bytecode of this checkout's modules, as an installed wheel has it.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this workplace sets it), every launch of an editable
    install would compile devicehost's sources again: about 50 ms of each cold start that no
    installed host pays. Site-packages got its bytecode from pip.
    """
    for tree in (REPO / "src", REPO / "benchmarks", *sorted(REPO.glob("plugins/*/src"))):
        compileall.compile_dir(tree, quiet=1)


def resources_arg(resources: Mapping[str, int]) -> str:
    return ",".join(f"{name}={count}" for name, count in resources.items())


class ServerProcess:
    """A launched server; ``started`` is the ``time.monotonic()`` just before it was spawned."""

    def __init__(self, proc: asyncio.subprocess.Process, started: float, log: IO[bytes]) -> None:
        self.proc = proc
        self.started = started
        self._log = log

    async def command(self, line: str) -> float:
        """Send one stdin command; return the ``time.monotonic()`` the server printed back."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()
        return float(await asyncio.wait_for(self.proc.stdout.readline(), STOP_WAIT))

    def usage(self) -> tuple[float, int]:
        """Resident memory in MB and thread count, from /proc/<pid>/status."""
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        )
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])

    def cpu_seconds(self) -> float:
        """User plus system CPU time so far, from /proc/<pid>/stat."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        """EOF on stdin (helpers) or SIGTERM (``devicehost run``); killed if it lingers."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        else:
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_WAIT)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self._log.close()


async def _spawn(argv: list[str], log_path: Path, env: Mapping[str, str], piped: bool) -> ServerProcess:
    log = log_path.open("ab")
    pipe = asyncio.subprocess.PIPE if piped else asyncio.subprocess.DEVNULL
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=pipe,
        stdout=pipe if piped else log,
        stderr=log,
        cwd=REPO,
        env={**os.environ, **env},
    )
    return ServerProcess(proc, started, log)


async def launch(kind: str, directory: Path, resources: Mapping[str, int], log: Path) -> ServerProcess:
    """``host``: ``devicehost run`` with the example backend; ``bare``: the bare servicer."""
    if kind == "host":
        argv = [str(DEVICEHOST), "run", "--device-plugins-dir", str(directory), "--backend", "example"]
        return await _spawn(argv, log, {EXAMPLE_ENV: resources_arg(resources)}, piped=False)
    argv = [sys.executable, "-m", "benchmarks.bare_server", "--dir", str(directory)]
    return await _spawn([*argv, "--resources", resources_arg(resources)], log, {}, piped=True)


async def launch_host_server(
    directory: Path, resources: Mapping[str, int], mode: str, health_interval: float, log: Path
) -> ServerProcess:
    """The host in-process with the benchmark's commandable backend (see ``host_server``)."""
    argv = [sys.executable, "-m", "benchmarks.host_server", "--dir", str(directory), "--log", str(log)]
    argv += ["--resources", resources_arg(resources), "--mode", mode]
    return await _spawn(
        [*argv, "--health-interval", str(health_interval)], log.with_suffix(".err"), {}, piped=True
    )


@contextlib.asynccontextmanager
async def running(server: ServerProcess) -> AsyncIterator[ServerProcess]:
    """Stop ``server`` however the block ends."""
    try:
        yield server
    finally:
        await server.stop()
