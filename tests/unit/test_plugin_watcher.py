"""The plugin-watcher path end to end: the host's ``Registration`` servicer
(``host/kubelet/plugin_watcher.py``) on a socket in a plugins_registry dir, found and judged by
the stand-in's plugin watcher (``standin/plugin_watcher.py``) as the kubelet's is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from waiting import eventually

from devicehost.host.kubelet.plugin_watcher import PLUGIN_TYPE, PluginRegistrationServicer
from devicehost.proto.pluginregistration.v1 import api_pb2_grpc
from devicehost.standin.model import VERSION
from devicehost.standin.plugin_watcher import (
    GET_INFO_TIMEOUT,
    PluginHandler,
    PluginWatcher,
    device_plugin_problem,
)

WIDGET = "example.com/widget"


@asynccontextmanager
async def registration_socket(
    path: Path, name: str, statuses: list[tuple[bool, str]], versions: tuple[str, ...] = (VERSION,)
) -> AsyncIterator[None]:
    """The host's Registration service for ``name`` on ``path``, until the block ends."""
    server = grpc.aio.server()
    servicer = PluginRegistrationServicer(
        name, lambda: str(path), lambda ok, error: statuses.append((ok, error)), versions=versions
    )
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(0)
        path.unlink(missing_ok=True)


def test_the_device_managers_validation_names_the_version_or_the_name() -> None:
    assert device_plugin_problem(WIDGET, "/x.sock", [VERSION]) is None
    assert device_plugin_problem(WIDGET, "/x.sock", ["v1alpha"]) == (
        f"manager version, {VERSION}, is not among plugin supported versions ['v1alpha']"
    )
    assert device_plugin_problem("widget", "/x.sock", [VERSION]) == (
        'invalid name of device plugin socket: the ResourceName "widget" is invalid'
    )


async def test_a_socket_is_registered_told_so_and_deregistered_when_it_goes(short_tmp: Path) -> None:
    registry = short_tmp / "registry"
    calls: list[tuple[str, str, str]] = []
    failed: list[tuple[str, str]] = []

    async def register(name: str, endpoint: str) -> str | None:
        calls.append(("register", name, endpoint))
        return None

    async def deregister(name: str, endpoint: str) -> None:
        calls.append(("deregister", name, endpoint))

    handler = PluginHandler(device_plugin_problem, register, deregister)
    watcher = PluginWatcher(registry, {PLUGIN_TYPE: handler}, lambda n, e: failed.append((n, e)))
    watcher.start()
    good, old = registry / "widget.sock", registry / "gizmo.sock"
    statuses: list[tuple[bool, str]] = []
    refused: list[tuple[bool, str]] = []
    try:
        async with registration_socket(good, WIDGET, statuses):
            await eventually(lambda: statuses == [(True, "")], "the registration status")
            assert calls == [("register", WIDGET, str(good))]
            async with registration_socket(old, "example.com/gizmo", refused, versions=("v1alpha",)):
                await eventually(lambda: len(refused) == 1, "the refusal")
        await eventually(lambda: len(calls) == 2, "the deregistration")
    finally:
        await watcher.stop()
    assert calls[1] == ("deregister", WIDGET, str(good))
    problem = (
        "RegisterPlugin error -- plugin validation failed with err: manager version, "
        f"{VERSION}, is not among plugin supported versions ['v1alpha']"
    )
    assert refused == [(False, problem)]
    assert failed == [("example.com/gizmo", problem)]


class SlowFirst(PluginRegistrationServicer):
    """Answers its first GetInfo only after the kubelet gave up on it (a host still starting)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = 0

    async def GetInfo(self, request: Any, context: Any) -> Any:
        self.asked += 1
        if self.asked == 1:
            await asyncio.sleep(GET_INFO_TIMEOUT + 0.5)
        return await super().GetInfo(request, context)


async def test_a_socket_whose_get_info_failed_is_tried_again_as_the_kubelets_reconciler_does(
    short_tmp: Path,
) -> None:
    registry = short_tmp / "registry"
    registered: list[str] = []
    failed: list[tuple[str, str]] = []

    async def register(name: str, endpoint: str) -> str | None:
        registered.append(name)
        return None

    async def deregister(name: str, endpoint: str) -> None:
        return None

    handler = PluginHandler(device_plugin_problem, register, deregister)
    watcher = PluginWatcher(registry, {PLUGIN_TYPE: handler}, lambda n, e: failed.append((n, e)))
    watcher.start()
    path = registry / "widget.sock"
    servicer = SlowFirst(WIDGET, lambda: str(path), lambda ok, error: None)
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        await eventually(lambda: registered == [WIDGET], "the registration, tried again", within=10)
    finally:
        await server.stop(0)
        await watcher.stop()
    assert servicer.asked == 2
    assert len(failed) == 1
    assert "DEADLINE_EXCEEDED" in failed[0][1]
