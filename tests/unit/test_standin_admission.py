"""Admission: how the stand-in picks, allocates, pre-starts and releases devices for a container."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devicehost.standin.admission import Admission, count_problem, fill_up, ids_problem
from devicehost.standin.events import EventLog
from devicehost.standin.model import AdmissionError, DeviceView
from devicehost.standin.registry import ResourceRecord, ResourceRegistry

NAME = "example.com/widget"
Context = grpc.aio.ServicerContext[Any, Any]


# -- the choosing rules ---------------------------------------------------------------------------


def test_available_ids_are_healthy_unallocated_and_in_list_order() -> None:
    record = ResourceRecord(
        NAME,
        devices=tuple(
            DeviceView(i, "Unhealthy" if i == "w1" else "Healthy", ()) for i in ("w3", "w1", "w0", "w2")
        ),
        allocated={"w0"},
    )
    assert record.available_ids() == ["w3", "w2"]


@pytest.mark.parametrize(
    ("preferred", "count", "chosen"),
    [
        ((), 2, ["w0", "w1"]),
        (("w2", "w1"), 2, ["w2", "w1"]),
        (("w2",), 3, ["w2", "w0", "w1"]),  # too few preferred: filled up in list order
        (("w2", "w2", "w1"), 2, ["w2", "w1"]),  # duplicates count once
        (("nope", "w3"), 2, ["w3", "w0"]),  # unavailable preferred IDs are dropped
        (("w3", "w2", "w1"), 2, ["w3", "w2"]),  # too many preferred: cut to the count
    ],
)
def test_fill_up_keeps_the_available_preferred_ids_and_fills_up_the_rest(
    preferred: tuple[str, ...], count: int, chosen: list[str]
) -> None:
    assert fill_up(preferred, ["w0", "w1", "w2", "w3"], count) == chosen


def test_refusals_use_the_kubelet_wording() -> None:
    assert count_problem(NAME, 2, ["w0", "w1"]) is None
    assert count_problem(NAME, 3, ["w0", "w1"]) == (
        f"requested number of devices unavailable for {NAME}. Requested: 3, Available: 2"
    )
    assert ids_problem(NAME, ["w0"], ["w0", "w1"]) is None
    assert ids_problem(NAME, ["w9", "w0", "w8"], ["w0"]) == f"{NAME}: devices ['w8', 'w9'] are not available"


# -- against a plugin ---------------------------------------------------------------------------


class Plugin(api_pb2_grpc.DevicePluginServicer):
    """A bare plugin that prefers the highest IDs and records every admission call."""

    def __init__(
        self,
        ids: list[str],
        *,
        empty_allocate: bool = False,
        preferred_fails: bool = False,
        pre_start_fails: bool = False,
        **options: bool,
    ) -> None:
        self.options = api_pb2.DevicePluginOptions(**options)
        self.devices = [api_pb2.Device(ID=i, health="Healthy") for i in ids]
        self.empty_allocate = empty_allocate
        self.preferred_fails = preferred_fails
        self.pre_start_fails = pre_start_fails
        self.calls: list[tuple[str, list[str]]] = []

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        yield api_pb2.ListAndWatchResponse(devices=self.devices)
        await asyncio.Event().wait()  # the stream stays open until the kubelet ends it

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        container = request.container_requests[0]
        self.calls.append(("preferred", list(container.available_deviceIDs)))
        if self.preferred_fails:
            await context.abort(grpc.StatusCode.UNKNOWN, "preferred broke")
        best = sorted(container.available_deviceIDs, reverse=True)[: container.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=best)]
        )

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        self.calls.append(("allocate", ids))
        if self.empty_allocate:
            return api_pb2.AllocateResponse()
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.append(("pre-start", list(request.devices_ids)))
        if self.pre_start_fails:
            await context.abort(grpc.StatusCode.UNKNOWN, "reset failed")
        return api_pb2.PreStartContainerResponse()


class Admitting:
    """A plugin served on a socket and connected into a registry, with admission over it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registry = ResourceRegistry(EventLog())
        self.admission = Admission(self.registry)
        self.server: grpc.aio.Server | None = None

    async def connect(self, plugin: Plugin) -> None:
        path = self.directory / "w.sock"
        self.server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, self.server)
        self.server.add_insecure_port(f"unix://{path}")
        await self.server.start()
        await self.registry.connect(
            NAME, str(path), dial_timeout=2, close_replaced=False, still_current=lambda: True
        )
        await self.registry.wait_for(NAME, healthy=len(plugin.devices), total=None, timeout=5)

    async def close(self) -> None:
        await self.registry.disconnect_all("test over")
        if self.server is not None:
            await self.server.stop(None)


@pytest.fixture
async def admitting(short_tmp: Path) -> AsyncIterator[Admitting]:
    setup = Admitting(short_tmp)
    yield setup
    await setup.close()


async def test_allocate_asks_preferred_then_allocates_then_pre_starts(admitting: Admitting) -> None:
    plugin = Plugin(["w0", "w1", "w2"], get_preferred_allocation_available=True, pre_start_required=True)
    await admitting.connect(plugin)

    result = await admitting.admission.allocate(NAME, 2, None, timeout=5)

    assert (result.device_ids, result.preferred, result.pre_started) == (("w2", "w1"), ("w2", "w1"), True)
    assert result.response.container_responses[0].envs["IDS"] == "w2,w1"
    assert plugin.calls == [
        ("preferred", ["w0", "w1", "w2"]),
        ("allocate", ["w2", "w1"]),
        ("pre-start", ["w2", "w1"]),
    ]
    assert admitting.registry[NAME].allocated == {"w1", "w2"}


async def test_allocated_devices_stay_taken_until_released(admitting: Admitting) -> None:
    plugin = Plugin(["w0", "w1"])
    await admitting.connect(plugin)
    first = await admitting.admission.allocate(NAME, 2, None, timeout=5)
    assert (first.device_ids, first.preferred, first.pre_started) == (("w0", "w1"), None, False)
    with pytest.raises(AdmissionError, match="Requested: 1, Available: 0"):
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    admitting.admission.release(NAME, ["w1"])
    assert (await admitting.admission.allocate(NAME, 1, None, timeout=5)).device_ids == ("w1",)
    admitting.admission.release(NAME)
    assert admitting.registry[NAME].allocated == set()
    assert [call for call, _ in plugin.calls] == ["allocate", "allocate"]


async def test_chosen_ids_skip_the_preferred_call_and_must_be_available(admitting: Admitting) -> None:
    plugin = Plugin(["w0", "w1", "w2"], get_preferred_allocation_available=True)
    await admitting.connect(plugin)
    result = await admitting.admission.allocate(NAME, 1, ["w2", "w0"], timeout=5)
    assert (result.device_ids, result.preferred) == (("w2", "w0"), None)
    with pytest.raises(AdmissionError, match=r"devices \['w0'\] are not available"):
        await admitting.admission.allocate(NAME, 1, ["w0", "w1"], timeout=5)
    assert plugin.calls == [("allocate", ["w2", "w0"])]


async def test_an_answer_without_containers_is_refused_and_books_nothing(admitting: Admitting) -> None:
    await admitting.connect(Plugin(["w0"], empty_allocate=True))
    with pytest.raises(AdmissionError, match="no containers return in allocation response"):
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    assert admitting.registry[NAME].allocated == set()


async def test_raw_allocate_ids_has_no_checks_and_no_bookkeeping(admitting: Admitting) -> None:
    plugin = Plugin(["w0"])
    await admitting.connect(plugin)
    response = await admitting.admission.allocate_ids(NAME, ["w0", "unknown"], timeout=5)
    assert response.container_responses[0].envs["IDS"] == "w0,unknown"
    assert admitting.registry[NAME].allocated == set()


async def test_a_disconnected_or_unknown_resource_is_not_admitted(admitting: Admitting) -> None:
    with pytest.raises(AdmissionError, match=f"^cannot allocate unregistered device {NAME}$"):
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    plugin = Plugin(["w0"])
    await admitting.connect(plugin)
    await admitting.registry.disconnect_all("kubelet restarted")
    # the real kubelet's text (tests/kubelet/test_host_process.py, after SIGTERM)
    with pytest.raises(
        AdmissionError, match=f"^no healthy devices present; cannot allocate unhealthy devices {NAME}$"
    ):
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    with pytest.raises(AdmissionError, match="no plugin connection"):
        await admitting.admission.allocate_ids(NAME, ["w0"], timeout=5)
    assert plugin.calls == []


async def test_a_failed_preferred_allocation_fails_admission_as_the_kubelet_says(
    admitting: Admitting,
) -> None:
    """kubelet 1.32 (tests/kubelet/test_allocation.py): the pod is refused, nothing is allocated."""
    plugin = Plugin(["w0", "w1"], get_preferred_allocation_available=True, preferred_fails=True)
    await admitting.connect(plugin)
    expected = "device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown desc = preferred broke"
    with pytest.raises(AdmissionError) as failed:
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    assert str(failed.value) == expected
    assert [call for call, _ in plugin.calls] == ["preferred"]
    assert admitting.registry[NAME].allocated == set()


async def test_a_failed_pre_start_keeps_the_devices_allocated(admitting: Admitting) -> None:
    """kubelet 1.32 (tests/kubelet/test_allocation.py): Allocate succeeded, so the pod holds them."""
    plugin = Plugin(["w0", "w1"], pre_start_required=True, pre_start_fails=True)
    await admitting.connect(plugin)
    with pytest.raises(grpc.aio.AioRpcError, match="reset failed"):
        await admitting.admission.allocate(NAME, 1, None, timeout=5)
    assert admitting.registry[NAME].allocated == {"w0"}
    with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
        await admitting.admission.allocate(NAME, 2, None, timeout=5)
