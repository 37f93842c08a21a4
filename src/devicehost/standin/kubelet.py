"""A kubelet stand-in: the device manager's side of the device plugin protocol, over grpc.aio,
and the DRA manager's side of Dynamic Resource Allocation.

It serves ``v1beta1.Registration`` on ``<device-plugins dir>/kubelet.sock``, dials each plugin
back before answering ``Register``, reads every ``ListAndWatch`` stream once (never retried)
and models kubelet 1.32 where plugins trip over it. Tests drive and inspect it::

    async with KubeletStandIn(tmp / "dp") as kubelet:
        ...  # start the plugin under test
        view = await kubelet.wait_for_resource("example.com/widget", healthy=4)
        result = await kubelet.allocate("example.com/widget", 2)

:class:`KubeletStandIn` is the device manager (:mod:`~devicehost.standin.device_manager`: records,
events, admission, and the calls tests use) with the kubelet around it: ``kubelet.sock`` and its
Registration service (:mod:`~devicehost.standin.registration`), the plugin watcher
(:mod:`~devicehost.standin.plugin_watcher`), the DRA manager (:mod:`~devicehost.standin.dra`,
``kubelet.dra``: drivers and their prepare and unprepare calls), and the kubelet's starts,
restarts and crashes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType

import structlog

from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.standin.connection import ConnectError
from devicehost.standin.device_manager import DeviceManager
from devicehost.standin.dra import CALL_TIMEOUT, DraManager
from devicehost.standin.dra import PLUGIN_TYPE as DRA_PLUGIN
from devicehost.standin.dra import validation_problem as dra_problem
from devicehost.standin.events import COMPONENT
from devicehost.standin.model import EventKind
from devicehost.standin.plugin_watcher import PLUGIN_TYPE as DEVICE_PLUGIN
from devicehost.standin.plugin_watcher import PluginHandler, PluginWatcher, device_plugin_problem
from devicehost.standin.pod_resources import PodResourcesServer, write_checkpoint
from devicehost.standin.registration import CHECKPOINT, LISTEN_DELAY, KubeletSocket, register_problem

DEPRECATION = "DEPRECATION"


class KubeletStandIn(DeviceManager):
    """The kubelet's device manager, for tests and ``devicehost run --simulate-kubelet``.

    ``close_replaced_streams=False`` models kubelet 1.32: a second ``Register`` of a resource
    leaves the old connection open, and when that old stream ends the resource is disconnected
    and the current connection closed too (its plugin sees its stream end).
    ``True`` models newer kubelets, which close the replaced connection quietly. A disconnected
    resource stays at allocatable 0 until it registers again (the kubelet's end state once its
    5-minute grace period is over; the grace period itself is not modelled). With a
    ``plugins_registry_dir`` the plugin watcher runs on it for DRA drivers (``kubelet.dra``;
    each call's deadline defaults to ``dra_call_timeout``, the kubelet's 45 s); ``watcher=True``
    lets device plugins register there too (else their sockets are left alone), and
    ``deprecation_file=True`` then also writes ``DEPRECATION`` in the device-plugins dir, as
    older kubelets did (kubelet 1.32's device-plugin handler does not: seen under dpharness).
    ``pod_resources_socket`` also serves the pod-resources API there
    (:mod:`~devicehost.standin.pod_resources`), fed by :meth:`allocate` and :meth:`release_pod`, and
    keeps the checkpoint file up to date.
    Each start binds ``kubelet.sock`` ``listen_delay`` s before it listens (connects refused).

    Waits and plugin calls take a ``timeout`` (the real kubelet has none; tests need one),
    hence the ``noqa: ASYNC109`` on those signatures.
    """

    def __init__(
        self,
        device_plugins_dir: Path,
        plugins_registry_dir: Path | None = None,
        *,
        watcher: bool = False,
        deprecation_file: bool = False,
        close_replaced_streams: bool = False,
        dial_timeout: float = 10.0,
        pod_resources_socket: Path | None = None,
        dra_call_timeout: float = CALL_TIMEOUT,
        listen_delay: float = LISTEN_DELAY,
        kubernetes_version: str = "1.35",  # 1.34 to 1.37: its DRA surface (standin/versions.py)
    ) -> None:
        if watcher and plugins_registry_dir is None:
            raise ValueError("watcher=True needs plugins_registry_dir")
        super().__init__()
        self.device_plugins_dir = Path(device_plugins_dir)
        self.plugins_registry_dir = plugins_registry_dir
        self.close_replaced_streams = close_replaced_streams
        self.dial_timeout = dial_timeout
        self._socket = KubeletSocket(self.device_plugins_dir, listen_delay)
        self.socket_path = self._socket.path
        self._watcher_enabled = watcher
        self._deprecation_file = deprecation_file
        self._watcher: PluginWatcher | None = None
        self.dra = DraManager(self._events, dra_call_timeout, kubernetes_version)
        """DRA drivers registered through ``plugins_registry``, and ``prepare``/``unprepare``."""
        self._log = structlog.get_logger("devicehost.kubelet").bind(component=COMPONENT)
        self.pod_resources_socket = pod_resources_socket
        self.pod_resources = PodResourcesServer(self._admission.pods, self._allocatable)
        if pod_resources_socket is not None:
            checkpoint = self.device_plugins_dir / CHECKPOINT
            self._admission.pods.on_change = lambda: write_checkpoint(checkpoint, self._admission.pods)

    async def __aenter__(self) -> KubeletStandIn:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Clean the dir but the checkpoint, then serve a new ``kubelet.sock``; returns once it listens."""
        self._socket.clean_dir()
        if self.plugins_registry_dir is not None:
            if self._watcher_enabled and self._deprecation_file:
                (self.device_plugins_dir / DEPRECATION).write_text(
                    "Device plugins may register through the plugins_registry dir.\n"
                )
            handlers = {DRA_PLUGIN: PluginHandler(dra_problem, self.dra.register, self.dra.deregister)}
            if self._watcher_enabled:
                handlers[DEVICE_PLUGIN] = PluginHandler(
                    device_plugin_problem,
                    self._connect_client,
                    lambda name, _: self._registry.deregister(name),
                )
            ignored = () if self._watcher_enabled else (DEVICE_PLUGIN,)
            self._watcher = PluginWatcher(self.plugins_registry_dir, handlers, self._register_failed, ignored)
            self._watcher.start()
        await self._socket.serve(self._register)
        if self.pod_resources_socket is not None:
            await self.pod_resources.serve(self.pod_resources_socket)
        self._log.info("kubelet started", socket=str(self.socket_path))

    async def stop(self) -> None:
        """Stop serving and close every plugin connection; no task is left running."""
        await self._shutdown("kubelet stopped")
        self._socket.release_old_inode()

    async def restart(self) -> None:
        """Restart as the kubelet does: connections close, the dir is cleaned, a new socket."""
        await self._shutdown("kubelet restarted")
        await self.start()

    async def crash(self, down_for: float) -> None:
        """Stop answering and remove ``kubelet.sock`` for ``down_for`` seconds, then start again."""
        await self._shutdown("kubelet crashed")
        self.socket_path.unlink(missing_ok=True)
        await asyncio.sleep(down_for)
        await self.start()

    async def _shutdown(self, reason: str) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        await self._socket.stop()
        if self.pod_resources_socket is not None:
            await self.pod_resources.stop(self.pod_resources_socket)
        await self._registry.disconnect_all(reason)
        await self.dra.disconnect_all(reason)

    def _allocatable(self) -> dict[str, list[str]]:
        """Every device the kubelet knows, by resource (GetAllocatableResources)."""
        return {name: [d.id for d in self._registry[name].devices] for name in self._registry.names}

    # -- registration (Register on kubelet.sock, or the plugin watcher) -----------------------

    async def _register(self, request: api_pb2.RegisterRequest) -> str | None:
        # Each start serves whatever ``self._register`` is then: tests wrap it to hold or count calls.
        error = register_problem(request)
        if error is None:
            try:
                endpoint = str(self.device_plugins_dir / request.endpoint)
                await self._connect_client(request.resource_name, endpoint)
            except ConnectError as exc:
                error = str(exc)
            else:
                return None
        self._register_failed(request.resource_name, error)
        return error

    def _register_failed(self, name: str, error: str) -> None:
        self._events.emit(EventKind.REGISTER_FAILED, name, error)

    async def _connect_client(self, name: str, socket_path: str) -> None:
        await self._registry.connect(
            name,
            socket_path,
            dial_timeout=self.dial_timeout,
            close_replaced=self.close_replaced_streams,
            still_current=self._socket.in_current_handler,
        )
