"""Fakes at the DRA seams for unit tests: an API server that counts calls and fails on demand,
a resource server with a real DeviceTable and Backend, and a backend plugin that records hooks.

The host's DRA rooms (claims, publisher, drivers) take these where production passes
``KubeCluster`` and ``ResourceServer``; nothing here serves gRPC or touches a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, Health
from devicehost.host.backends.backend import Backend
from devicehost.host.daemon import Host
from devicehost.host.dra.allocated import Attached
from devicehost.host.dra.cluster import ClusterError
from devicehost.host.serving.table import DeviceTable
from devicehost.standin.kubelet import KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host


class CountingCluster(ClusterStandIn):
    """The in-memory API server, counting each call by method; ``failing[method]`` makes that
    method raise ClusterError with the given message (``down`` fails them all)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.failing: dict[str, str] = {}

    def _count(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.failing:
            raise ClusterError(self.failing[method])

    async def node_uid(self, node: str) -> str:
        self._count("node_uid")
        return await super().node_uid(node)

    async def claim(self, namespace: str, name: str) -> Any:
        self._count("claim")
        return await super().claim(namespace, name)

    async def slices(self, node: str, driver: str) -> dict[str, Mapping[str, Any]]:
        self._count("slices")
        return await super().slices(node, driver)

    async def create_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._count("create_slice")
        return await super().create_slice(body)

    async def replace_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._count("replace_slice")
        return await super().replace_slice(body)

    async def delete_slice(self, name: str) -> None:
        self._count("delete_slice")
        await super().delete_slice(name)

    async def slice_events(self, node: str, driver: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        self._count("slice_events")
        async for event in super().slice_events(node, driver):
            yield event


class Recorder:
    """A backend plugin with one resource: records every allocate (with its ClaimRequest) and
    release; ``answers[device_id]`` replaces the allocate answer for a set containing that device
    (an exception is raised)."""

    def __init__(self, resource: str = "example.com/widget", config_model: Any = None) -> None:
        self.resource = resource
        self.config_model = config_model
        self.allocated: list[tuple[str, tuple[str, ...], ClaimRequest | None]] = []
        self.released: list[tuple[str, tuple[str, ...]]] = []
        self.released_shares: list[dict[str, str]] = []
        """For each release of shares: device ID -> share ID."""
        self.answers: dict[str, Any] = {}

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return []

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> Any:
        self.allocated.append((resource, device_ids, claim))
        for device_id in device_ids:
            if device_id in self.answers:
                answer = self.answers[device_id]
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> None:
        self.released.append((resource, device_ids))
        if claim is not None:
            self.released_shares.append({d: share.id for d, share in claim.shares.items()})


class ModelRecorder(Recorder):
    """A :class:`Recorder` that declares a claim configuration model."""

    @devicehost.hookimpl
    def devicehost_claim_config_model(self) -> Any:
        return self.config_model


@dataclass
class FakeServer:
    """What the DRA rooms read of a ResourceServer: its name, device table, backend and log."""

    name: str
    table: DeviceTable
    backend: Backend
    log: Any = field(default_factory=lambda: structlog.get_logger("fake-server"))
    device_plugin: bool = True
    """Served through the device plugin API too: prepared devices are held there."""


def widgets(count: int, prefix: str = "w", **health: Health) -> list[Device]:
    """``count`` devices ``w0``..; ``health`` names the ones that are not healthy."""
    return [Device(f"{prefix}{n}", health.get(f"{prefix}{n}", Health.HEALTHY)) for n in range(count)]


@contextmanager
def fake_server(
    plugin: object, devices: Sequence[Device], resource: str = "example.com/widget"
) -> Iterator[FakeServer]:
    """A :class:`FakeServer` over ``plugin``; its backend's threads are closed afterwards."""
    backend = Backend("fake", plugin, hook_timeout=5.0)
    try:
        yield FakeServer(
            resource, DeviceTable(devices), backend, structlog.get_logger("fake").bind(resource=resource)
        )
    finally:
        backend.close()


def attached(server: FakeServer, pool: str, slice_name: str = "slice") -> Attached:
    """``server`` as a driver's attached resource; no publishing task follows it (a done one)."""
    return Attached(server, pool, slice_name, _done_task())  # type: ignore[arg-type]


def _done_task() -> asyncio.Task[None]:
    async def nothing() -> None:
        return None

    return asyncio.get_running_loop().create_task(nothing())


def checkpoint_file(tmp_path: Path) -> Path:
    return tmp_path / "driver" / "devicehost-claims.json"


@contextmanager
def dra_root(prefix: str) -> Iterator[Path]:
    """A short temporary dir (unix socket paths) with the kubelet's ``registry`` dir in it."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir="/tmp") as tmp:
        (Path(tmp) / "registry").mkdir()
        yield Path(tmp)


@asynccontextmanager
async def dra_host(
    root: Path,
    backends: Mapping[str, object],
    cluster: ClusterStandIn,
    node: str,
    *,
    kubelet: bool = True,
    **settings: Any,
) -> AsyncIterator[Host]:
    """The real host serving ``backends`` through DRA only, in ``root``, on ``cluster``; with
    ``kubelet``, the kubelet stand-in's plugin watcher on ``root / "registry"`` registers its drivers."""
    (root / "dp").mkdir(exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        if kubelet:
            await stack.enter_async_context(KubeletStandIn(root / "dp", root / "registry"))
        yield await stack.enter_async_context(
            running_host(
                root / "dp",
                dict(backends),
                cluster=cluster,
                serve_through=dict.fromkeys(backends, "dra"),
                node_name=node,
                dra_plugins_dir=root / "plugins",
                plugins_registry_dir=root / "registry",
                cdi_dir=root / "cdi",
                device_release=False,
                **settings,
            )
        )
