"""The kubelet's device manager once plugins are connected: what it knows and what it admits.

:class:`DeviceManager` puts together the records of resources
(:mod:`~devicehost.standin.registry`), the event log (:mod:`~devicehost.standin.events`) and
admission (:mod:`~devicehost.standin.admission`), and holds the calls tests use to read and
drive them. How plugins get connected (``kubelet.sock``, the plugin watcher) and the kubelet's
starts and stops are :class:`~devicehost.standin.kubelet.KubeletStandIn`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.admission import Admission
from devicehost.standin.events import EventLog
from devicehost.standin.model import AllocationResult, Event, EventKind, ListRecord, ResourceView
from devicehost.standin.registry import ListObserver, ResourceRegistry


class DeviceManager:
    """Resources, their events and admission, read and driven as tests do.

    A base of :class:`~devicehost.standin.kubelet.KubeletStandIn` only: on its own nothing
    connects plugins to it. The split keeps the calls over the parts apart from the kubelet's
    lifecycle; the parts themselves are composed, not inherited.

    Waits and plugin calls take a ``timeout`` (the real kubelet has none; tests need one),
    hence the ``noqa: ASYNC109`` on those signatures.
    """

    def __init__(self) -> None:
        self._events = EventLog()
        self._registry = ResourceRegistry(self._events)
        self._admission = Admission(self._registry)

    def name_backends(self, backend_of: Callable[[str], str | None]) -> None:
        """Label the log lines about a resource with ``backend_of(resource)`` (when not None)."""
        self._events.backend_of = backend_of

    # -- inspection --------------------------------------------------------------------------

    @property
    def resources(self) -> list[str]:
        """Names of the resources the kubelet knows (connected or not)."""
        return self._registry.names

    @property
    def events(self) -> list[Event]:
        """Every event so far, oldest first."""
        return self._events.since(0)

    def view(self, name: str) -> ResourceView:
        """A snapshot of one resource; ``KeyError`` when it never registered."""
        return self._registry[name].view()

    def registrations(self, name: str) -> int:
        """How many times ``name`` registered successfully (restarts included)."""
        res = self._registry.get(name)
        return res.registrations if res else 0

    def history(self, name: str) -> list[ListRecord]:
        """Every ListAndWatch list received for ``name``, oldest first."""
        res = self._registry.get(name)
        return list(res.history) if res else []

    def observe_lists(self, observer: ListObserver) -> None:
        """Call ``observer(resource, message)`` for every ListAndWatch message as it arrives."""
        self._registry.list_observers.append(observer)

    def options(self, name: str) -> api_pb2.DevicePluginOptions:
        """The options from ``GetDevicePluginOptions`` (the ones in ``RegisterRequest`` are ignored)."""
        return self._registry[name].options

    def capacity(self, name: str) -> int:
        """Devices listed for ``name``, healthy or not."""
        res = self._registry.get(name)
        return len(res.devices) if res else 0

    def allocatable(self, name: str) -> int:
        """Healthy devices while the stream is connected; 0 once it is disconnected."""
        res = self._registry.get(name)
        return res.view().healthy if res else 0

    def unhealthy(self, name: str) -> int:
        """Devices that count as unhealthy: all of them once the resource is disconnected."""
        return self.capacity(name) - self.allocatable(name)

    async def wait_for_resource(
        self,
        name: str,
        healthy: int | None = None,
        total: int | None = None,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> ResourceView:
        """Wait until ``name`` is registered, streaming, and its latest list matches the counts."""
        return await self._registry.wait_for(name, healthy, total, timeout)

    async def wait_for_event(
        self,
        kind: EventKind | str | None = None,
        resource: str | None = None,
        *,
        since: int | None = None,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> Event:
        """The first event at index ``since`` or later (default: from now) that matches."""
        return await self._events.wait_for(kind, resource, since, timeout)

    # -- driving the plugin ------------------------------------------------------------------

    def stub(self, name: str) -> api_pb2_grpc.DevicePluginAsyncStub:
        """The current connection's DevicePlugin stub, for raw calls."""
        return self._registry.stub(name)

    def drop_stream(self, name: str) -> None:
        """Cancel ``name``'s ListAndWatch from the kubelet side; it is never retried."""
        self._registry.drop_stream(name)

    def release(self, name: str, device_ids: Sequence[str] | None = None) -> None:
        """Free devices as when pods end (the plugin is not told); all of them by default."""
        self._admission.release(name, device_ids)

    def release_pod(self, pod: str, namespace: str = "default") -> dict[str, list[str]]:
        """A pod ended: its devices are free (pod-resources stops listing them); they by resource."""
        return self._admission.release_pod((namespace, pod))

    @property
    def pods(self) -> dict[tuple[str, str], dict[str, dict[str, list[str]]]]:
        """Running pods by (namespace, name): container -> resource -> device IDs."""
        return self._admission.pods.pods

    async def allocate_ids(
        self,
        name: str,
        device_ids: Sequence[str],
        *,
        timeout: float = 5,  # noqa: ASYNC109
    ) -> api_pb2.AllocateResponse:
        """One raw ``Allocate`` for one container: no checks, no bookkeeping."""
        return await self._admission.allocate_ids(name, device_ids, timeout)

    async def allocate(
        self,
        name: str,
        count: int = 1,
        device_ids: Sequence[str] | None = None,
        *,
        timeout: float = 5,  # noqa: ASYNC109
        pod: str | None = None,
        namespace: str = "default",
        container: str = "main",
    ) -> AllocationResult:
        """Admit one container asking for ``count`` devices, as the kubelet does.

        GetPreferredAllocation first when the options offer it (its answer is advisory: the
        kubelet keeps the available IDs from it and fills up the rest itself), then Allocate,
        then PreStartContainer when ``pre_start_required``. ``device_ids`` picks the devices
        instead (no preferred call). gRPC errors from the plugin propagate as ``AioRpcError``.
        The devices are booked to ``container`` of ``namespace/pod`` (a new ``default/pod-<n>``
        when no pod is named) until :meth:`release_pod` or :meth:`release`.
        """
        key = None if pod is None else (namespace, pod)
        return await self._admission.allocate(name, count, device_ids, timeout, key, container)
