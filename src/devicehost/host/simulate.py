"""``devicehost run --simulate-kubelet``: the real host against the kubelet stand-in.

For trying the host and a backend on a machine with no Kubernetes: a temporary dir with the
kubelet's device-plugins, plugins and plugins_registry dirs and a CDI dir, the stand-in kubelet
serving there, an in-memory API server (:mod:`devicehost.standin.apiserver`) for DRA, and the
host serving into them. It shows every resource the kubelet registers, its devices and health as
they change, one sample allocation per device plugin resource and, per DRA driver, one sample
claim prepared (configured with the first example the backend's claim config model offers, and
with the devices, CDI devices and environment a container would get) and unprepared, until
interrupted.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from google.protobuf import json_format

from devicehost.host.app import run_host
from devicehost.host.backends.config_examples import config_examples
from devicehost.host.dra.names import driver_name
from devicehost.standin import AdmissionError, DraCallError, DraDevice, EventKind, KubeletStandIn
from devicehost.standin.apiserver import ApiServerStandIn, Unschedulable
from devicehost.standin.events import COMPONENT

if TYPE_CHECKING:
    from devicehost.host.backends.backend import Backend
    from devicehost.host.config import HostConfig
    from devicehost.host.daemon import Host

log = structlog.get_logger("devicehost.simulate")

NODE = "simulated-node"
"""The node name DRA publishes under when the config names none."""
SAMPLE_NAMESPACE = "simulated"


async def run_simulated(
    config: HostConfig,
    backends: Sequence[Backend],
    *,
    failed_backends: Mapping[str, str] | None = None,
    reload_config: Callable[[], HostConfig] | None = None,
    config_file: Path | None = None,
    metrics_listener: socket.socket | None = None,
    kubernetes_version: str | None = None,
) -> None:
    """Run the host on a stand-in kubelet in a temporary dir until SIGINT/SIGTERM; the kubelet
    and API server stand-ins present ``kubernetes_version`` (None: 1.35).

    :func:`devicehost.host.app.run_host` serves and owns the signals; this adds the stand-in in
    front of it and a task that reports what the stand-in sees.
    """
    workdir = Path(tempfile.mkdtemp(prefix="devicehost-sim-", dir="/tmp"))
    config = _keep_dir(config, workdir)

    def reload() -> HostConfig:
        return _keep_dir(reload_config(), workdir) if reload_config is not None else config

    config.plugins_registry_dir.mkdir(parents=True)
    kubelet = KubeletStandIn(
        config.device_plugins_dir,
        config.plugins_registry_dir,
        pod_resources_socket=config.pod_resources_socket,
        kubernetes_version=kubernetes_version or "1.35",
    )
    apiserver = ApiServerStandIn(kubernetes_version or "1.35")
    names = _BackendNames()
    kubelet.name_backends(names.of)
    try:
        await kubelet.start()
        log.info(
            "simulated kubelet started; press Ctrl-C to stop",
            component=COMPONENT,
            device_plugins_dir=str(config.device_plugins_dir),
        )
        show = asyncio.create_task(_show(kubelet, names, apiserver, config.cdi_dir))
        try:
            await run_host(
                config,
                backends,
                failed_backends=failed_backends,
                reload_config=reload,
                config_file=config_file,
                on_start=names.follow,
                cluster=lambda: apiserver,
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

    def claim_config(self, driver: str) -> dict[str, Any] | None:
        """The first configuration the claim config model of the backend serving ``driver``
        offers as an example (:mod:`devicehost.host.backends.config_examples`); None without one."""
        if self.host is None:
            return None
        for name, server in self.host.resources.items():
            model = server.backend.claim_config_model
            if model is not None and driver_name(name, self.host.config.dra_drivers) == driver:
                return next(iter(config_examples(model)), None)
        return None

    def of(self, resource: str) -> str | None:
        server = self.host.resources.get(resource) if self.host is not None else None
        if server is not None:
            self._known[resource] = server.backend.name
        return self._known.get(resource)


def _keep_dir(config: HostConfig, workdir: Path) -> HostConfig:
    """The config (a reloaded one too) points at the simulated kubelet's dirs in ``workdir`` (its
    device-plugins, plugins and plugins_registry dirs, its pod-resources socket, a CDI dir),
    never at the machine's own kubelet or runtime; DRA gets a node name when the config has none."""
    return config.model_copy(
        update={
            "device_plugins_dir": workdir / "device-plugins",
            "pod_resources_socket": workdir / "pod-resources" / "kubelet.sock",
            "plugins_registry_dir": workdir / "plugins_registry",
            "dra_plugins_dir": workdir / "plugins",
            "cdi_dir": workdir / "cdi",
            "node_name": config.node_name or NODE,
        }
    )


async def _show(
    kubelet: KubeletStandIn, names: _BackendNames, apiserver: ApiServerStandIn, cdi_dir: Path
) -> None:
    """Report what the kubelet sees, allocate once from each newly registered resource, and
    prepare one sample claim of each newly registered DRA driver."""
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
        if (
            event.kind == EventKind.REGISTERED
            and event.resource in kubelet.dra.drivers
            and event.resource not in sampled
        ):
            sampled.add(event.resource)
            config = names.claim_config(event.resource)
            await _sample_claim(kubelet, apiserver, event.resource, cdi_dir, config)


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


async def _sample_claim(
    kubelet: KubeletStandIn,
    apiserver: ApiServerStandIn,
    driver: str,
    cdi_dir: Path,
    config: Mapping[str, Any] | None,
) -> None:
    """Allocate one device of ``driver`` to a claim configured with ``config`` (the backend's
    example), as the scheduler would, have the kubelet prepare it, say what a container would
    get, and unprepare it again."""
    labels = {"component": COMPONENT, "driver": driver}
    try:
        async with asyncio.timeout(10):
            await apiserver.wait(lambda a: bool(a.devices(driver)))
        ref = apiserver.allocate(
            driver, namespace=SAMPLE_NAMESPACE, name=f"sample-{driver}", request="sample", config=config
        )
    except (TimeoutError, Unschedulable) as exc:
        log.error("sample claim not allocated: no device published", **labels, error=str(exc) or "timed out")
        return
    claim = f"{ref[0]}/{ref[2]}"
    try:
        await _bound(apiserver, ref, labels)
        prepared = (await kubelet.dra.prepare(driver, [ref]))[ref[1]]
        log.info(
            "sample claim prepared",
            **labels,
            claim=claim,
            config=config,
            devices=[f"{d.pool}/{d.device}" for d in prepared],
            cdi_devices=[i for d in prepared for i in d.cdi_ids],
            env=_container_env(cdi_dir, prepared),
            status_devices=apiserver.device_statuses(ref[0], ref[2]),
        )
        await kubelet.dra.unprepare(driver, [ref])
        log.info("sample claim unprepared", **labels, claim=claim)
    except DraCallError as exc:
        log.error("sample claim failed", **labels, claim=claim, config=config, error=str(exc))
    finally:
        apiserver.claims.pop((ref[0], ref[2]), None)


async def _bound(apiserver: ApiServerStandIn, ref: tuple[str, str, str], labels: dict[str, str]) -> None:
    """Wait, as the scheduler does before it binds the pod, until every binding condition of the
    claim's devices is True in its status (at once for devices without any); say so when it waited."""
    if apiserver.bindable(ref[0], ref[2]):
        return
    try:
        await apiserver.wait(lambda a: a.bindable(ref[0], ref[2]), timeout=10)
    except TimeoutError:
        raise DraCallError("binding conditions not True within 10 s") from None
    log.info(
        "sample claim bound: its binding conditions are True",
        **labels,
        claim=f"{ref[0]}/{ref[2]}",
        status_devices=apiserver.device_statuses(ref[0], ref[2]),
    )


def _container_env(cdi_dir: Path, devices: Sequence[DraDevice]) -> dict[str, str]:
    """The environment the CDI specs in ``cdi_dir`` give a container with ``devices``' CDI IDs."""
    wanted = {i for d in devices for i in d.cdi_ids}
    env: dict[str, str] = {}
    for path in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for device in spec.get("devices", ()):
            if f"{spec.get('kind')}={device.get('name')}" in wanted:
                edits = device.get("containerEdits", {}).get("env", ())
                env |= dict(e.partition("=")[::2] for e in edits)
    return env
