"""DevicePluginServicer over a real gRPC server, device table and stream set, called through a channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hostfakes import ScriptedBackend, TopologyBackend, widgets

import devicehost
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, Mount
from devicehost.host.backends.backend import Backend, BackendBusy, HookError, HookTimeout
from devicehost.host.serving.servicer import DevicePluginServicer, hook_status
from devicehost.host.serving.streams import StreamSet
from devicehost.host.serving.table import DeviceTable
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

RESOURCE = "example.com/widget"
WAIT = 5.0
"""Seconds any single await on the server may take before the test fails."""


class Observations:
    """The ``observe_allocation`` callback: the durations it was given, and a way to wait for them."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._signal = asyncio.Event()

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self._signal.set()

    async def wait_for(self, count: int) -> list[float]:
        """The durations, once there are ``count`` of them.

        A failed call is observed after its status went out (in the handler's ``finally``), so
        the client can see the error first.
        """
        while len(self.seconds) < count:
            self._signal.clear()
            await asyncio.wait_for(self._signal.wait(), WAIT)
        return list(self.seconds)


@dataclass
class Served:
    plugin: ScriptedBackend
    backend: Backend
    table: DeviceTable
    streams: StreamSet
    servicer: DevicePluginServicer
    stub: api_pb2_grpc.DevicePluginStub
    observed: Observations
    lost: list[int]
    lost_signal: asyncio.Event


@contextlib.asynccontextmanager
async def serving(
    directory: Path, plugin: ScriptedBackend, hook_timeout: float = 2.0
) -> AsyncIterator[Served]:
    """``plugin``'s resource served on a unix socket in ``directory``, and a stub talking to it."""
    backend = Backend("b", plugin, hook_timeout)
    table = DeviceTable(plugin.resources[0].devices)
    lost: list[int] = []
    lost_signal = asyncio.Event()

    def on_lost(epoch: int) -> None:
        lost.append(epoch)
        lost_signal.set()

    streams = StreamSet(table, on_lost)
    observed = Observations()
    servicer = DevicePluginServicer(backend, RESOURCE, table, streams, observed)
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
    path = directory / "dp.sock"
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            yield Served(plugin, backend, table, streams, servicer, stub, observed, lost, lost_signal)
    finally:
        plugin.hang.set()
        await streams.end_all()
        await server.stop(None)
        backend.close()


def plugin_with(cls: type[ScriptedBackend] = ScriptedBackend) -> ScriptedBackend:
    return cls(widgets(RESOURCE, 4))


def allocate_request(*containers: Sequence[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(c)) for c in containers]
    )


def preferred_request(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available),
                must_include_deviceIDs=list(must_include),
                allocation_size=size,
            )
        ]
    )


def listed(message: api_pb2.ListAndWatchResponse) -> list[tuple[str, str, list[int]]]:
    return [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in message.devices]


async def failure(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    """The error a call ends with (the test fails if it succeeds)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call, WAIT)
    return caught.value


class PreferredOnly(ScriptedBackend):
    @devicehost.hookimpl
    def devicehost_preferred_allocation(self, request: devicehost.PreferredAllocationRequest) -> list[str]:
        return list(request.available[: request.size])


class PreStartOnly(ScriptedBackend):
    @devicehost.hookimpl
    def devicehost_pre_start_container(self, device_ids: tuple[str, ...]) -> None:
        self._record("devicehost_pre_start_container")


@pytest.mark.parametrize(
    ("cls", "pre_start", "preferred"),
    [
        pytest.param(ScriptedBackend, False, False, id="no-optional-hooks"),
        pytest.param(TopologyBackend, True, True, id="both-optional-hooks"),
        pytest.param(PreferredOnly, False, True, id="preferred-allocation-only"),
        pytest.param(PreStartOnly, True, False, id="pre-start-only"),
    ],
)
async def test_options_reflect_the_optional_hooks(
    short_tmp: Path, cls: type[ScriptedBackend], pre_start: bool, preferred: bool
) -> None:
    async with serving(short_tmp, plugin_with(cls)) as s:
        options = await asyncio.wait_for(s.stub.GetDevicePluginOptions(api_pb2.Empty()), WAIT)
    assert options == api_pb2.DevicePluginOptions(
        pre_start_required=pre_start, get_preferred_allocation_available=preferred
    )


async def test_list_and_watch_sends_the_devices_then_each_change(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        call = s.stub.ListAndWatch(api_pb2.Empty())
        first = await asyncio.wait_for(call.read(), WAIT)
        assert listed(first) == [
            ("w0", "Healthy", [0]),
            ("w1", "Healthy", [1]),
            ("w2", "Healthy", [0]),
            ("w3", "Healthy", [1]),
        ]
        assert s.streams.count == 1

        assert s.table.set_health({"w1": Health.UNHEALTHY})
        second = await asyncio.wait_for(call.read(), WAIT)
        assert [(d.ID, d.health) for d in second.devices] == [
            ("w0", "Healthy"),
            ("w1", "Unhealthy"),
            ("w2", "Healthy"),
            ("w3", "Healthy"),
        ]

        assert s.table.set_health({"w1": Health.HEALTHY, "w3": Health.UNHEALTHY})
        third = await asyncio.wait_for(call.read(), WAIT)
        assert [d.health for d in third.devices] == ["Healthy", "Healthy", "Healthy", "Unhealthy"]

        assert s.table.replace([Device("w9", numa_nodes=(1,))])
        fourth = await asyncio.wait_for(call.read(), WAIT)
        assert listed(fourth) == [("w9", "Healthy", [1])]
        assert s.servicer.updates_sent == 4
        assert s.lost == []

        call.cancel()
        await asyncio.wait_for(s.lost_signal.wait(), WAIT)
        assert s.lost == [0]
        assert s.streams.count == 0


async def test_a_lost_stream_reports_the_epoch_it_was_opened_in(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        s.streams.new_epoch()
        s.streams.new_epoch()
        call = s.stub.ListAndWatch(api_pb2.Empty())
        await asyncio.wait_for(call.read(), WAIT)
        s.streams.new_epoch()  # a later registration: this stream still belongs to epoch 2
        call.cancel()
        await asyncio.wait_for(s.lost_signal.wait(), WAIT)
        assert s.lost == [2]


async def test_streams_ended_by_the_host_are_not_lost(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        calls = [s.stub.ListAndWatch(api_pb2.Empty()) for _ in range(2)]
        for call in calls:
            await asyncio.wait_for(call.read(), WAIT)
        assert s.streams.count == 2
        await s.streams.end_all()
        for call in calls:
            assert await asyncio.wait_for(call.read(), WAIT) is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        assert s.streams.count == 0
        assert s.lost == []


async def test_allocate_maps_the_backend_answer_to_the_wire(short_tmp: Path) -> None:
    plugin = plugin_with()
    plugin.allocate_answer = ContainerAllocation(
        envs={"WIDGETS": "w1,w2"},
        mounts=[
            Mount(container_path="/etc/widget", host_path="/var/lib/widget", read_only=True),
            Mount(container_path="/data", host_path="/srv/data"),
        ],
        devices=[
            DeviceSpec(container_path="/dev/widget1", host_path="/dev/null", permissions="rwm"),
            DeviceSpec(container_path="/dev/widget2", host_path="/dev/zero", permissions="r"),
        ],
        annotations={"example.com/widgets": "2"},
        cdi_devices=["example.com/widget=w1", "example.com/widget=w2"],
    )
    async with serving(short_tmp, plugin) as s:
        response = await asyncio.wait_for(s.stub.Allocate(allocate_request(["w1", "w2"])), WAIT)
        assert response == api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs={"WIDGETS": "w1,w2"},
                    mounts=[
                        api_pb2.Mount(
                            container_path="/etc/widget", host_path="/var/lib/widget", read_only=True
                        ),
                        api_pb2.Mount(container_path="/data", host_path="/srv/data", read_only=False),
                    ],
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path="/dev/widget1", host_path="/dev/null", permissions="rwm"
                        ),
                        api_pb2.DeviceSpec(
                            container_path="/dev/widget2", host_path="/dev/zero", permissions="r"
                        ),
                    ],
                    annotations={"example.com/widgets": "2"},
                    cdi_devices=[
                        api_pb2.CDIDevice(name="example.com/widget=w1"),
                        api_pb2.CDIDevice(name="example.com/widget=w2"),
                    ],
                )
            ]
        )
        assert plugin.calls == [("devicehost_allocate", RESOURCE)]
        (seconds,) = await s.observed.wait_for(1)
        assert seconds >= 0
        assert s.servicer.allocations == 1
        assert s.servicer.errors == Counter()


async def test_allocate_answers_each_container_with_its_own_devices(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        response = await asyncio.wait_for(s.stub.Allocate(allocate_request(["w0"], ["w3", "w1"])), WAIT)
        assert [dict(c.envs) for c in response.container_responses] == [{"IDS": "w0"}, {"IDS": "w3,w1"}]
        assert [[d.container_path for d in c.devices] for c in response.container_responses] == [
            ["/dev/w0"],
            ["/dev/w3", "/dev/w1"],
        ]
        assert s.plugin.count("devicehost_allocate", RESOURCE) == 2
        assert len(await s.observed.wait_for(1)) == 1, "one observation per Allocate call"
        assert s.servicer.allocations == 1


@pytest.mark.parametrize(
    ("containers", "message"),
    [
        pytest.param((), "AllocateRequest has no container requests", id="no-containers"),
        pytest.param(([],), "a container request names no device IDs", id="no-ids"),
        pytest.param((["w0", "w1", "w0"],), "a container request repeats a device ID", id="repeated-id"),
        pytest.param(
            (["w0", "nope", "zz"],),
            f"unknown device IDs for {RESOURCE}: 'nope', 'zz'",
            id="unknown-ids",
        ),
        pytest.param(
            ([f"x{n}" for n in range(12)],),
            f"unknown device IDs for {RESOURCE}: " + ", ".join(f"'x{n}'" for n in range(10)) + " ...",
            id="many-unknown-ids",
        ),
    ],
)
async def test_a_bad_allocate_request_is_invalid_argument(
    short_tmp: Path, containers: tuple[list[str], ...], message: str
) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        error = await failure(s.stub.Allocate(allocate_request(*containers)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == message
        assert s.plugin.count("devicehost_allocate") == 0
        assert s.servicer.errors == Counter({"INVALID_ARGUMENT": 1})
        assert len(await s.observed.wait_for(1)) == 1, "failed calls are observed too"
        assert s.servicer.allocations == 0


async def test_a_hook_that_raises_is_unknown(short_tmp: Path) -> None:
    plugin = plugin_with()
    plugin.allocate_error = RuntimeError("widget w0 is on fire")
    async with serving(short_tmp, plugin) as s:
        error = await failure(s.stub.Allocate(allocate_request(["w0"])))
        assert error.code() == grpc.StatusCode.UNKNOWN
        assert error.details() == "backend 'b' devicehost_allocate raised RuntimeError: widget w0 is on fire"
        assert s.servicer.errors == Counter({"UNKNOWN": 1})
        assert s.backend.failures == Counter({"devicehost_allocate": 1})
        assert len(await s.observed.wait_for(1)) == 1


async def test_a_hook_that_hangs_is_deadline_exceeded(short_tmp: Path) -> None:
    plugin = plugin_with()
    plugin.hanging = {"devicehost_allocate"}
    async with serving(short_tmp, plugin, hook_timeout=0.1) as s:
        error = await failure(s.stub.Allocate(allocate_request(["w0"])))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert error.details() == "backend 'b' devicehost_allocate did not return within 0.1 s"
        assert s.servicer.errors == Counter({"DEADLINE_EXCEEDED": 1})
        assert s.backend.failures == Counter({"devicehost_allocate": 1})


async def test_a_backend_whose_threads_all_hang_is_unavailable(short_tmp: Path) -> None:
    plugin = plugin_with()
    plugin.hanging = {"devicehost_allocate"}
    async with serving(short_tmp, plugin, hook_timeout=0.2) as s:
        hung = await asyncio.gather(
            *(failure(s.stub.Allocate(allocate_request(["w0"]))) for _ in range(8)),
        )
        assert {e.code() for e in hung} == {grpc.StatusCode.DEADLINE_EXCEEDED}
        error = await failure(s.stub.Allocate(allocate_request(["w1"])))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "not called: 8 earlier hook calls have not returned" in error.details()
        assert s.plugin.count("devicehost_allocate") <= 8, "the ninth call never reached the hook"
        assert s.servicer.errors == Counter({"DEADLINE_EXCEEDED": 8, "UNAVAILABLE": 1})


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(HookTimeout("b", "h", "hung"), grpc.StatusCode.DEADLINE_EXCEEDED, id="timeout"),
        pytest.param(BackendBusy("b", "h", "busy"), grpc.StatusCode.UNAVAILABLE, id="busy"),
        pytest.param(HookError("b", "h", "raised"), grpc.StatusCode.UNKNOWN, id="raised"),
    ],
)
def test_hook_status(exc: HookError, code: grpc.StatusCode) -> None:
    assert hook_status(exc) == code


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param("all good", "returned str, expected ContainerAllocation", id="not-an-allocation"),
        pytest.param(
            ContainerAllocation(envs={"A": 1}),  # type: ignore[dict-item]
            "envs and annotations must map non-empty strings to strings, got 'A': 1",
            id="env-value-not-a-string",
        ),
        pytest.param(
            ContainerAllocation(annotations={"": "x"}),
            "envs and annotations must map non-empty strings to strings, got '': 'x'",
            id="empty-annotation-key",
        ),
        pytest.param(
            ContainerAllocation(mounts=[Mount(container_path="etc/widget", host_path="/var/lib/widget")]),
            "mount path 'etc/widget' must be absolute",
            id="relative-mount-path",
        ),
        pytest.param(
            ContainerAllocation(devices=[DeviceSpec(container_path="/dev/w0", host_path="dev/w0")]),
            "device path 'dev/w0' must be absolute",
            id="relative-device-path",
        ),
        pytest.param(
            ContainerAllocation(
                devices=[DeviceSpec(container_path="/dev/w0", host_path="/dev/w0", permissions="rwx")]
            ),
            "device permissions 'rwx' must be made of r, w and m",
            id="bad-permissions",
        ),
        pytest.param(
            ContainerAllocation(cdi_devices=["widget-w0"]),
            "CDI device name 'widget-w0' is not fully qualified (vendor.com/class=name)",
            id="unqualified-cdi-name",
        ),
        pytest.param(
            ContainerAllocation(mounts=["/var/lib/widget"]),  # type: ignore[list-item]
            "mounts must be a sequence of devicehost.Mount",
            id="mount-not-a-Mount",
        ),
        pytest.param(
            ContainerAllocation(envs=[("A", "1")]),  # type: ignore[arg-type]
            "envs must be a mapping, got list",
            id="envs-not-a-mapping",
        ),
        pytest.param(
            ContainerAllocation(
                mounts=[Mount(container_path="/etc/widget", host_path="/var/lib/widget", read_only="yes")]
            ),  # type: ignore[arg-type]
            "mount read_only must be a bool, got 'yes'",
            id="read-only-not-a-bool",
        ),
    ],
)
async def test_a_wrong_allocate_answer_is_internal(short_tmp: Path, answer: object, problem: str) -> None:
    plugin = plugin_with()
    plugin.allocate_answer = answer
    async with serving(short_tmp, plugin) as s:
        error = await failure(s.stub.Allocate(allocate_request(["w0"])))
        assert error.code() == grpc.StatusCode.INTERNAL, error.details()
        assert error.details().startswith("backend 'b' devicehost_allocate ")
        assert problem in error.details()
        assert s.servicer.errors == Counter({"INTERNAL": 1})
        assert s.backend.failures == Counter({"devicehost_allocate": 1})
        assert s.servicer.allocations == 0


async def test_preferred_allocation_without_the_hook_is_unimplemented(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        error = await failure(s.stub.GetPreferredAllocation(preferred_request(["w0", "w1"], [], 1)))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert error.details() == f"{RESOURCE} has no preferred allocation"
        assert s.servicer.errors == Counter({"UNIMPLEMENTED": 1})


async def test_preferred_allocation_asks_the_backend(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with(TopologyBackend)) as s:
        request = preferred_request(["w3", "w1", "w2", "w1"], ["w2"], 2)
        request.container_requests.append(
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["w0", "w3"], allocation_size=1)
        )
        response = await asyncio.wait_for(s.stub.GetPreferredAllocation(request), WAIT)
        assert [list(c.deviceIDs) for c in response.container_responses] == [["w2", "w1"], ["w0"]]
        assert s.plugin.count("devicehost_preferred_allocation") == 2
        assert s.servicer.errors == Counter()


@pytest.mark.parametrize(
    ("available", "must_include", "size", "message"),
    [
        pytest.param(
            ["w0", "w1", "w2"],
            [],
            4,
            "cannot pick 4 of 3 available devices including 0 must-include ones",
            id="size-larger-than-available",
        ),
        pytest.param(
            ["w0", "w1"],
            ["w2"],
            1,
            "cannot pick 1 of 2 available devices including 1 must-include ones",
            id="must-include-not-available",
        ),
        pytest.param(
            ["w0", "w1"],
            ["w0", "w1"],
            1,
            "cannot pick 1 of 2 available devices including 2 must-include ones",
            id="size-smaller-than-must-include",
        ),
        pytest.param(
            ["w0", "ghost"], [], 1, f"unknown device IDs for {RESOURCE}: 'ghost'", id="unknown-available"
        ),
        pytest.param(
            ["w0"], ["spook"], 1, f"unknown device IDs for {RESOURCE}: 'spook'", id="unknown-must-include"
        ),
    ],
)
async def test_a_bad_preferred_allocation_request_is_invalid_argument(
    short_tmp: Path, available: list[str], must_include: list[str], size: int, message: str
) -> None:
    async with serving(short_tmp, plugin_with(TopologyBackend)) as s:
        error = await failure(s.stub.GetPreferredAllocation(preferred_request(available, must_include, size)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.details()
        assert s.plugin.count("devicehost_preferred_allocation") == 0
        assert s.servicer.errors == Counter({"INVALID_ARGUMENT": 1})


async def test_a_wrong_preferred_allocation_answer_is_internal(short_tmp: Path) -> None:
    class Greedy(TopologyBackend):
        @devicehost.hookimpl
        def devicehost_preferred_allocation(
            self, request: devicehost.PreferredAllocationRequest
        ) -> list[str]:
            return list(request.available)

    async with serving(short_tmp, plugin_with(Greedy)) as s:
        error = await failure(s.stub.GetPreferredAllocation(preferred_request(["w0", "w1", "w2"], [], 2)))
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == (
            "backend 'b' devicehost_preferred_allocation returned 3 device IDs, the kubelet asked for 2"
        )
        assert s.backend.failures == Counter({"devicehost_preferred_allocation": 1})
        assert s.servicer.errors == Counter({"INTERNAL": 1})


async def test_pre_start_container_calls_the_hook(short_tmp: Path) -> None:
    plugin = plugin_with(TopologyBackend)
    assert isinstance(plugin, TopologyBackend)
    async with serving(short_tmp, plugin) as s:
        response = await asyncio.wait_for(
            s.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["w2", "w0"])), WAIT
        )
        assert response == api_pb2.PreStartContainerResponse()
        assert plugin.pre_started == [("w2", "w0")]
        assert s.servicer.errors == Counter()


async def test_pre_start_container_without_the_hook_answers_ok(short_tmp: Path) -> None:
    async with serving(short_tmp, plugin_with()) as s:
        response = await asyncio.wait_for(
            s.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["w0"])), WAIT
        )
        assert response == api_pb2.PreStartContainerResponse()
        assert s.plugin.calls == []


async def test_pre_start_container_checks_ids_and_reports_hook_failures(short_tmp: Path) -> None:
    class Failing(TopologyBackend):
        @devicehost.hookimpl
        def devicehost_pre_start_container(self, device_ids: tuple[str, ...]) -> None:
            raise OSError("reset failed")

    async with serving(short_tmp, plugin_with(Failing)) as s:
        unknown = await failure(
            s.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["w9"]))
        )
        assert unknown.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert unknown.details() == f"unknown device IDs for {RESOURCE}: 'w9'"
        raised = await failure(s.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["w0"])))
        assert raised.code() == grpc.StatusCode.UNKNOWN
        assert raised.details() == "backend 'b' devicehost_pre_start_container raised OSError: reset failed"
        assert s.servicer.errors == Counter({"INVALID_ARGUMENT": 1, "UNKNOWN": 1})


async def test_errors_count_every_code(short_tmp: Path) -> None:
    plugin = plugin_with()
    async with serving(short_tmp, plugin) as s:
        await failure(s.stub.Allocate(allocate_request()))
        await failure(s.stub.Allocate(allocate_request(["nope"])))
        await failure(s.stub.GetPreferredAllocation(preferred_request(["w0"], [], 1)))
        plugin.allocate_error = ValueError("no")
        await failure(s.stub.Allocate(allocate_request(["w0"])))
        plugin.allocate_error = None
        await asyncio.wait_for(s.stub.Allocate(allocate_request(["w0"])), WAIT)
        assert s.servicer.errors == Counter({"INVALID_ARGUMENT": 2, "UNIMPLEMENTED": 1, "UNKNOWN": 1})
        assert s.servicer.allocations == 1
        assert len(await s.observed.wait_for(4)) == 4
