"""``devicehost run --simulate-kubelet``: the real host against the kubelet stand-in.

For trying the host and a backend on a machine with no Kubernetes: a temporary device-plugins
dir, the stand-in kubelet serving ``kubelet.sock`` there, and the host serving into it. It shows
every resource the kubelet registers, its devices and health as they change, and one sample
allocation per resource, until interrupted.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from google.protobuf import json_format

from devicehost.host.app import run_host
from devicehost.standin import AdmissionError, EventKind, KubeletStandIn
from devicehost.standin.events import COMPONENT

if TYPE_CHECKING:
    from devicehost.host.backends.backend import Backend
    from devicehost.host.config import HostConfig
    from devicehost.host.daemon import Host

log = structlog.get_logger("devicehost.simulate")


async def run_simulated(
    config: HostConfig,
    backends: Sequence[Backend],
    *,
    failed_backends: Mapping[str, str] | None = None,
    reload_config: Callable[[], HostConfig] | None = None,
    config_file: Path | None = None,
    metrics_listener: socket.socket | None = None,
) -> None:
    """Run the host on a stand-in kubelet in a temporary dir until SIGINT/SIGTERM.

    :func:`devicehost.host.app.run_host` serves and owns the signals; this adds the stand-in in
    front of it and a task that reports what the stand-in sees.
    """
    workdir = Path(tempfile.mkdtemp(prefix="devicehost-sim-", dir="/tmp"))
    directory = workdir / "device-plugins"
    config = _keep_dir(config, directory)

    def reload() -> HostConfig:
        return _keep_dir(reload_config(), directory) if reload_config is not None else config

    kubelet = KubeletStandIn(directory, pod_resources_socket=config.pod_resources_socket)
    names = _BackendNames()
    kubelet.name_backends(names.of)
    try:
        await kubelet.start()
        log.info(
            "simulated kubelet started; press Ctrl-C to stop",
            component=COMPONENT,
            device_plugins_dir=str(directory),
        )
        show = asyncio.create_task(_show(kubelet, names))
        try:
            await run_host(
                config,
                backends,
                failed_backends=failed_backends,
                reload_config=reload,
                config_file=config_file,
                on_start=names.follow,
                metrics_listener=metrics_listener,
            )
        finally:
            show.cancel()
            await asyncio.wait([show])
    finally:
        await kubelet.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class _BackendNames:
    """Which backend serves a resource, read from the host, for the simulated kubelet's lines.

    Remembered once seen: the host forgets a resource as it withdraws it, before the kubelet
    reports the stream's end.
    """

    def __init__(self) -> None:
        self.host: Host | None = None
        self._known: dict[str, str] = {}

    def follow(self, host: Host) -> None:
        self.host = host

    @property
    def stopping(self) -> bool:
        return self.host is not None and self.host.stopping.is_set()

    def of(self, resource: str) -> str | None:
        server = self.host.resources.get(resource) if self.host is not None else None
        if server is not None:
            self._known[resource] = server.backend.name
        return self._known.get(resource)


def _keep_dir(config: HostConfig, directory: Path) -> HostConfig:
    """The config (a reloaded one too) points at the simulated kubelet's device-plugins dir and
    its pod-resources socket beside it, never at the machine's own kubelet."""
    pod_resources = directory.parent / "pod-resources" / "kubelet.sock"
    return config.model_copy(update={"device_plugins_dir": directory, "pod_resources_socket": pod_resources})


async def _show(kubelet: KubeletStandIn, names: _BackendNames) -> None:
    """Report what the kubelet sees, and allocate once from each newly registered resource."""
    seen = 0
    sampled: set[str] = set()
    while True:
        try:
            event = await kubelet.wait_for_event(since=seen, timeout=3600)
        except AssertionError:
            continue
        seen += 1
        if event.kind in (EventKind.DEVICES, EventKind.DISCONNECTED):
            _log_view(kubelet, names, event.resource)
        if (
            event.kind == EventKind.DEVICES
            and event.resource not in sampled
            and kubelet.allocatable(event.resource)
        ):
            sampled.add(event.resource)
            await _sample_allocation(kubelet, event.resource, _labels(names, event.resource))


def _labels(names: _BackendNames, resource: str) -> dict[str, str]:
    backend = names.of(resource)
    return {"component": COMPONENT, "resource": resource, **({"backend": backend} if backend else {})}


def _log_view(kubelet: KubeletStandIn, names: _BackendNames, resource: str) -> None:
    """The kubelet's counts; at the host's stop, said as what they are: the resource went away."""
    counts = {
        "capacity": kubelet.capacity(resource),
        "allocatable": kubelet.allocatable(resource),
        "unhealthy": kubelet.unhealthy(resource),
    }
    if names.stopping:
        # The kubelet keeps a gone plugin's devices as unhealthy until its grace period ends.
        log.info("kubelet view: withdrawn by the stopping host", **_labels(names, resource), **counts)
    else:
        log.info("kubelet view", **_labels(names, resource), **counts)


async def _sample_allocation(kubelet: KubeletStandIn, resource: str, labels: dict[str, str]) -> None:
    try:
        result = await kubelet.allocate(resource, 1)
    except (AdmissionError, grpc.aio.AioRpcError) as exc:
        log.error("sample allocation failed", **labels, error=str(exc))
        return
    kubelet.release(resource, result.device_ids)
    answer = json_format.MessageToDict(result.response.container_responses[0])
    log.info("sample allocation", **labels, devices=list(result.device_ids), response=answer)
