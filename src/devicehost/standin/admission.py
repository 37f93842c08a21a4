"""Admitting a pod's container, as the kubelet's device manager does it.

Pick the devices (asking ``GetPreferredAllocation`` when the plugin offers it), ``Allocate``
them, ``PreStartContainer`` when the plugin requires it, and keep them allocated until
:meth:`Admission.release`. The choosing rules are plain functions, so they can be read and
tested without a plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.model import AdmissionError, AllocationResult
from devicehost.standin.pod_resources import PodAssignments, PodKey
from devicehost.standin.registry import ResourceRegistry

PRE_START_TIMEOUT = 30.0
"""The kubelet's own bound on ``PreStartContainer``."""


def fill_up(preferred: Iterable[str], available: Sequence[str], count: int) -> list[str]:
    """The kubelet's use of a preferred answer: it is advisory.

    The available IDs from it are kept (in its order, once each, at most ``count``), and the
    rest is filled up from ``available`` in order.
    """
    chosen = [i for i in dict.fromkeys(preferred) if i in available][:count]
    return chosen + [i for i in available if i not in chosen][: count - len(chosen)]


def count_problem(name: str, count: int, available: Sequence[str]) -> str | None:
    """The kubelet's refusal when fewer devices are available than requested (kubelet text)."""
    if len(available) < count:
        return (
            f"requested number of devices unavailable for {name}. "
            f"Requested: {count}, Available: {len(available)}"
        )
    return None


def go_rpc_error(exc: grpc.aio.AioRpcError) -> str:
    """A gRPC error as the kubelet's Go client prints it: ``rpc error: code = Unknown desc = ...``."""
    code = "".join(part.capitalize() for part in exc.code().name.split("_"))
    return f"rpc error: code = {code} desc = {exc.details()}"


def ids_problem(name: str, device_ids: Iterable[str], available: Sequence[str]) -> str | None:
    """The refusal when devices picked by the test are not available."""
    missing = sorted(set(device_ids) - set(available))
    return f"{name}: devices {missing} are not available" if missing else None


class Admission:
    """Allocate and release devices of the resources in a :class:`ResourceRegistry`."""

    def __init__(self, registry: ResourceRegistry) -> None:
        self._registry = registry
        self.pods = PodAssignments()
        """Who holds which device, as the pod-resources API reports it."""
        self._pod_numbers = 0

    def release(self, name: str, device_ids: Sequence[str] | None = None) -> None:
        """Free devices as when pods end (the plugin is not told); all of them by default."""
        allocated = self._registry[name].allocated
        if device_ids is None:
            allocated.clear()
        else:
            allocated.difference_update(device_ids)
        self.pods.remove_devices(name, device_ids)

    def release_pod(self, pod: PodKey) -> dict[str, list[str]]:
        """A pod ended: free every device its containers held; those devices by resource."""
        freed = self.pods.remove_pod(pod)
        for name, ids in freed.items():
            record = self._registry.get(name)
            if record is not None:
                record.allocated.difference_update(ids)
        return freed

    def pod_for(self, pod: PodKey | None) -> PodKey:
        """The pod an admission is for: the one named, else a new ``default/pod-<n>``."""
        if pod is not None:
            return pod
        self._pod_numbers += 1
        return ("default", f"pod-{self._pod_numbers}")

    async def allocate_ids(
        self,
        name: str,
        device_ids: Sequence[str],
        timeout: float,  # noqa: ASYNC109
    ) -> api_pb2.AllocateResponse:
        """One raw ``Allocate`` for one container: no checks, no bookkeeping."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        return await self._registry.stub(name).Allocate(request, timeout=timeout)

    async def allocate(
        self,
        name: str,
        count: int,
        device_ids: Sequence[str] | None,
        timeout: float,  # noqa: ASYNC109
        pod: PodKey | None = None,
        container: str = "main",
    ) -> AllocationResult:
        """Choose, Allocate, PreStartContainer when required, and book the devices to the pod."""
        res = self._registry.get(name)
        if res is None:
            raise AdmissionError(f"cannot allocate unregistered device {name}")
        if not res.connected or res.conn is None or not any(d.healthy for d in res.devices):
            # the kubelet marks a disconnected resource's devices unhealthy (kubelet text)
            raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {name}")
        available = res.available_ids()
        preferred: tuple[str, ...] | None = None
        if device_ids is not None:
            problem = ids_problem(name, device_ids, available)
            chosen = list(device_ids)
        else:
            problem = count_problem(name, count, available)
            if problem is None and res.options.get_preferred_allocation_available:
                preferred = await self._preferred(res.conn.stub, available, count, timeout)
            chosen = fill_up(preferred or (), available, count)
        if problem is not None:
            raise AdmissionError(problem)
        response = await self.allocate_ids(name, chosen, timeout)
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        res.allocated.update(chosen)
        pod = self.pod_for(pod)
        self.pods.assign(pod, container, name, chosen)
        if res.options.pre_start_required:
            await self._registry.stub(name).PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=chosen), timeout=min(timeout, PRE_START_TIMEOUT)
            )
        return AllocationResult(tuple(chosen), response, preferred, res.options.pre_start_required, pod)

    @staticmethod
    async def _preferred(
        stub: api_pb2_grpc.DevicePluginAsyncStub,
        available: list[str],
        count: int,
        timeout: float,  # noqa: ASYNC109
    ) -> tuple[str, ...]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=[], allocation_size=count
                )
            ]
        )
        try:
            answer = await stub.GetPreferredAllocation(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:  # the kubelet fails the admission (kubelet text)
            raise AdmissionError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(exc)}"
            ) from exc
        return tuple(i for r in answer.container_responses for i in r.deviceIDs)
