"""Admitting a pod's container, as the kubelet's device manager does it.

Pick the devices (asking ``GetPreferredAllocation`` when the plugin offers it), ``Allocate``
them, ``PreStartContainer`` when the plugin requires it, and keep them allocated until
:meth:`Admission.release`. The choosing rules are plain functions, so they can be read and
tested without a plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.model import AdmissionError, AllocationResult
from devicehost.standin.registry import ResourceRecord, ResourceRegistry

PRE_START_TIMEOUT = 30.0
"""The kubelet's own bound on ``PreStartContainer``."""


def available_ids(record: ResourceRecord) -> list[str]:
    """Healthy devices not allocated to a container, in the plugin's list order."""
    return [d.id for d in record.devices if d.healthy and d.id not in record.allocated]


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


def ids_problem(name: str, device_ids: Iterable[str], available: Sequence[str]) -> str | None:
    """The refusal when devices picked by the test are not available."""
    missing = sorted(set(device_ids) - set(available))
    return f"{name}: devices {missing} are not available" if missing else None


class Admission:
    """Allocate and release devices of the resources in a :class:`ResourceRegistry`."""

    def __init__(self, registry: ResourceRegistry) -> None:
        self._registry = registry

    def release(self, name: str, device_ids: Sequence[str] | None = None) -> None:
        """Free devices as when pods end (the plugin is not told); all of them by default."""
        allocated = self._registry[name].allocated
        if device_ids is None:
            allocated.clear()
        else:
            allocated.difference_update(device_ids)

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
    ) -> AllocationResult:
        """Choose, Allocate, PreStartContainer when required, and book the devices."""
        res = self._registry.get(name)
        if res is None or not res.connected or res.conn is None:
            raise AdmissionError(f"device plugin for {name} is not registered or not connected")
        available = available_ids(res)
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
        if res.options.pre_start_required:
            await self._registry.stub(name).PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=chosen), timeout=min(timeout, PRE_START_TIMEOUT)
            )
        return AllocationResult(tuple(chosen), response, preferred, res.options.pre_start_required)

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
        answer = await stub.GetPreferredAllocation(request, timeout=timeout)
        return tuple(i for r in answer.container_responses for i in r.deviceIDs)
