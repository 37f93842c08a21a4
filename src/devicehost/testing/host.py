"""Run the real host for tests: in this process, or as a ``devicehost run`` child process.

In-process, the host serves plugin objects handed to it or installed backends loaded by name
through the host's own loader (stevedore over the ``devicehost.backends`` entry points)::

    async with KubeletStandIn(directory) as kubelet, running_host(directory, ["acme"]) as host:
        await kubelet.wait_for_resource("acme.com/widget", healthy=4)

Nothing here imports pytest, so vendors can drive the host from any test runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devicehost import cdi
from devicehost.host.app import running
from devicehost.host.backends.backend import Backend
from devicehost.host.backends.loader import load_backends
from devicehost.host.config import HostConfig
from devicehost.host.daemon import Host
from devicehost.host.dra.cluster import Cluster

STOP_TIMEOUT = 10.0


class BackendLoadError(RuntimeError):
    """A backend named for the test host could not be loaded; the message says why."""


def load_named(names: Sequence[str], hook_timeout: float) -> list[Backend]:
    """Load installed backends by entry-point name, as the host does; fail on any that breaks."""
    statuses = load_backends(list(names), (), hook_timeout)
    failed = [f"{s.name}: {s.error}" for s in statuses if s.backend is None]
    if failed:
        for status in statuses:
            if status.backend is not None:
                status.backend.close()
        raise BackendLoadError("; ".join(failed))
    return [s.backend for s in statuses if s.backend is not None]


def beside_kubelet(device_plugins_dir: Path) -> Path:
    """Where a kubelet whose device-plugins dir is ``device_plugins_dir`` serves pod-resources."""
    return Path(device_plugins_dir).parent / "pod-resources" / "kubelet.sock"


@contextlib.asynccontextmanager
async def running_host(
    device_plugins_dir: Path,
    backends: Mapping[str, object] | Sequence[str],
    /,
    *,
    reload_config: Callable[[], HostConfig] | None = None,
    cluster: Cluster | None = None,
    **config: Any,
) -> AsyncIterator[Host]:
    """The real :class:`Host` serving into ``device_plugins_dir`` until the block ends.

    Everything ``devicehost run`` starts around the host is started too (the metrics and probe
    endpoints when ``metrics_address`` is given), except the signal handlers.

    :param backends: plugin objects by backend name, or names of installed backends.
    :param reload_config: what ``host.request_reload()`` reads as the new configuration.
    :param cluster: the API server DRA talks to, e.g. a :class:`~devicehost.testing.cluster.ClusterStandIn`.
    :param config: any other :class:`HostConfig` field (``backends=`` holds the settings).
        ``pod_resources_socket`` defaults to ``pod-resources/kubelet.sock`` beside
        ``device_plugins_dir`` (the kubelet's layout), never the machine's own kubelet;
        ``cdi_dir`` defaults to :func:`devicehost.cdi.default_dir` (the kit's
        ``devicehost_cdi_dir`` fixture points it at a temporary dir).
    """
    config.setdefault("pod_resources_socket", beside_kubelet(device_plugins_dir))
    config.setdefault("cdi_dir", cdi.default_dir())
    host_config = HostConfig(device_plugins_dir=Path(device_plugins_dir), **config)
    if isinstance(backends, Mapping):
        loaded = [Backend(name, plugin, host_config.hook_timeout) for name, plugin in backends.items()]
    else:
        loaded = load_named(backends, host_config.hook_timeout)
    make_cluster = None if cluster is None else (lambda: cluster)
    async with running(host_config, loaded, reload_config=reload_config, cluster=make_cluster) as host:
        yield host


class HostProcess:
    """A ``devicehost run`` child process whose JSON log lines are collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[dict[str, Any]] = []
        """Every log line so far; a line that is not JSON is kept as ``{"raw": text}``."""
        self.stderr = ""
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="devicehost log reader")
        self._stderr_reader = asyncio.create_task(self._read_stderr(), name="devicehost stderr reader")

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            text = raw.decode(errors="replace").rstrip("\n")
            try:
                line = json.loads(text)
            except ValueError:
                line = {"raw": text}
            self.lines.append(line if isinstance(line, dict) else {"raw": text})
            self._changed.set()
        self._changed.set()

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = (await self.process.stderr.read()).decode(errors="replace")

    def find(self, event: str, **fields: Any) -> dict[str, Any] | None:
        """The first log line so far with this ``event`` and these field values."""
        for line in self.lines:
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return line
        return None

    async def wait_for_log(self, event: str, timeout: float = 15, **fields: Any) -> dict[str, Any]:  # noqa: ASYNC109
        """Wait for a log line with this ``event`` and fields; fail with what was seen."""
        try:
            async with asyncio.timeout(timeout):
                while (found := self.find(event, **fields)) is None and not self._reader.done():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            pass
        found = self.find(event, **fields)
        if found is None:
            seen = [line.get("event", line.get("raw")) for line in self.lines]
            raise AssertionError(
                f"no {event!r} {fields} in the host's log; saw {seen}; stderr {self.stderr!r}"
            )
        return found

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        """Signal the process, wait for its exit and its last log lines; the exit status."""
        if self.process.returncode is None:
            self.process.send_signal(sig)
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(f"devicehost did not exit within {timeout:g} s of signal {sig}") from None
        await asyncio.gather(self._reader, self._stderr_reader)
        return code


@contextlib.asynccontextmanager
async def host_process(
    device_plugins_dir: Path,
    backends: Sequence[str],
    *,
    config_file: Path | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cdi_dir: Path | None = None,
) -> AsyncIterator[HostProcess]:
    """``devicehost run`` as a child process with JSON logs; stopped with SIGTERM at the end.

    :param backends: installed backend names, each passed as ``--backend``.
    :param config_file: a host config file (``backends.<name>`` holds a backend's settings).
    :param args: further ``devicehost run`` options, such as ``--health-interval 0.1``.
    :param env: the child's environment (default: this process's, without ``DEVICEHOST_*``).
    :param cdi_dir: the child's ``--cdi-dir`` (default: :func:`devicehost.cdi.default_dir`, which
        the kit's ``devicehost_cdi_dir`` fixture points at a temporary dir). As a command-line
        flag it overrides ``config_file``'s ``cdi_dir``; a ``--cdi-dir`` in ``args`` comes later
        and wins.
    """
    command = [sys.executable, "-m", "devicehost", "run", "--device-plugins-dir", str(device_plugins_dir)]
    command += ["--cdi-dir", str(cdi_dir if cdi_dir is not None else cdi.default_dir())]
    command += [f"--backend={name}" for name in backends]
    if config_file is not None:
        command += ["--config", str(config_file)]
    command += ["--log-format", "json", *args]
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEHOST_")}
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(env)
    )
    child = HostProcess(process)
    try:
        yield child
    finally:
        with contextlib.suppress(AssertionError):
            await child.stop()
