"""The DevicePlugin gRPC servicer of one resource.

It answers the kubelet from the resource's :class:`DeviceTable` and its backend's hooks. Bad
requests get INVALID_ARGUMENT naming the IDs; an Allocate of a device the resource's inventory
masks (held through DRA, or overdrawing a shared counter set) gets FAILED_PRECONDITION with why; a hook that raises gets UNKNOWN naming the backend
and the exception, one that hangs DEADLINE_EXCEEDED, one that answers nonsense INTERNAL.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn

import grpc
import structlog

from devicehost import policies
from devicehost.hookspecs import rules
from devicehost.hookspecs.types import PreferredAllocationRequest
from devicehost.host.backends.backend import AnswerRefused, Backend, BackendBusy, HookError, HookTimeout
from devicehost.host.inventory import DEVICE_PLUGIN
from devicehost.host.serving import wire
from devicehost.host.serving.streams import StreamSet
from devicehost.host.serving.table import DeviceTable
from devicehost.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = structlog.get_logger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED

MIN_PUSH_INTERVAL = 0.02
"""Seconds between two ListAndWatch messages on one stream: a flapping device costs the kubelet at
most 50 updates a second, and the last state always goes out."""


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource of one backend."""

    def __init__(
        self,
        backend: Backend,
        resource: str,
        table: DeviceTable,
        streams: StreamSet,
        observe_allocation: Callable[[float], None],
        policy: str = "none",
    ) -> None:
        self.backend = backend
        self.resource = resource
        self.table = table
        self._streams = streams
        self._observe_allocation = observe_allocation
        self.updates_sent = 0
        self.allocations = 0
        self.errors: Counter[str] = Counter()
        """Calls answered with an error, by gRPC status code name."""
        prefers = backend.implements("devicehost_preferred_allocation")
        self.policy = None if prefers or policy == "none" else policy  # a devicehost.policies name
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=backend.implements("devicehost_pre_start_container"),
            get_preferred_allocation_available=prefers or self.policy is not None,
        )

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        with self._streams.open() as stream:
            log.info("ListAndWatch stream opened", streams=self._streams.count)
            sent_version, sent = -1, None
            last_sent = 0.0
            while not stream.ending:
                if self.table.version != sent_version:
                    pause = last_sent + MIN_PUSH_INTERVAL - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)
                        continue
                    sent_version, message = self.table.version, self.table.message()
                    if message is not sent:  # the same message: only what DRA offers changed
                        sent, last_sent = message, time.monotonic()
                        self.updates_sent += 1
                        yield message
                    continue
                await self.table.wait_for_change(sent_version)

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        try:
            response = await self._allocate(request, context)
        finally:
            self._observe_allocation(time.perf_counter() - started)
        self.allocations += 1
        return response

    async def _allocate(self, request: api_pb2.AllocateRequest, context: Context) -> api_pb2.AllocateResponse:
        if not request.container_requests:
            await self._abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "AllocateRequest has no container requests"
            )
        containers = [tuple(container.devices_ids) for container in request.container_requests]
        for ids in containers:
            await self._check_ids(context, ids)
        given = [i for ids in containers for i in ids]
        problem = self._masked_problem(given)
        if problem:
            log.warning("Allocate refused", devices=given, problem=problem)
            await self._abort(context, grpc.StatusCode.FAILED_PRECONDITION, problem)
        with self.table.allocating(given, time.monotonic()):  # held from before the hooks on
            responses = [await self._allocated(context, ids) for ids in containers]
        return api_pb2.AllocateResponse(container_responses=responses)

    async def _allocated(self, context: Context, ids: tuple[str, ...]) -> api_pb2.ContainerAllocateResponse:
        try:
            allocation = await self.backend.allocate(self.resource, ids)
        except HookError as exc:
            await self._abort_hook(context, exc)
        log.debug("allocated", devices=list(ids))
        return wire.container_allocation(allocation)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: Context,
    ) -> api_pb2.PreferredAllocationResponse:
        if not self.options.get_preferred_allocation_available:
            await self._abort(context, UNIMPLEMENTED, f"{self.resource} has no preferred allocation")
        responses = []
        for container in request.container_requests:
            available = tuple(dict.fromkeys(container.available_deviceIDs))
            must_include = tuple(dict.fromkeys(container.must_include_deviceIDs))
            size = container.allocation_size
            await self._check_known(context, (*available, *must_include))
            problem = rules.preferred_request_problem(available, must_include, size)
            if problem:
                await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
            ask = PreferredAllocationRequest(available, must_include, size)
            if self.policy is not None:
                answer: Sequence[str] = policies.choose(self.policy, self.table.devices, ask)
            else:
                try:
                    answer = await self.backend.preferred_allocation(self.resource, ask)
                except HookError as exc:
                    await self._abort_hook(context, exc)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(answer)))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: Context,
    ) -> api_pb2.PreStartContainerResponse:
        ids = tuple(request.devices_ids)
        await self._check_ids(context, ids)
        if self.backend.implements("devicehost_pre_start_container"):
            try:
                await self.backend.pre_start_container(self.resource, ids)
            except HookError as exc:
                await self._abort_hook(context, exc)
        return api_pb2.PreStartContainerResponse()

    async def _check_ids(self, context: Context, ids: Sequence[str]) -> None:
        problem = ids_problem(ids) or self._unknown_problem(ids)
        if problem:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)

    async def _check_known(self, context: Context, ids: Sequence[str]) -> None:
        problem = self._unknown_problem(ids)
        if problem:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)

    def _unknown_problem(self, ids: Sequence[str]) -> str | None:
        """The IDs that are not devices of the resource, named (the first ten)."""
        unknown = self.table.unknown(ids)
        if not unknown:
            return None
        shown = ", ".join(repr(i[:80]) for i in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        return f"unknown device IDs for {self.resource}: {shown}"

    def _masked_problem(self, ids: Sequence[str]) -> str | None:
        """Why ``ids`` cannot go to a container now: the other API holds one, or they would
        overdraw a shared counter set with what both APIs hold."""
        problem = self.table.view().refusal(DEVICE_PLUGIN, ids)
        return f"{self.resource}: {problem}" if problem else None

    async def _abort(self, context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
        self.errors[code.name] += 1
        await context.abort(code, message)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises

    async def _abort_hook(self, context: Context, exc: HookError) -> NoReturn:
        code = hook_status(exc)
        what = "hook answer refused" if isinstance(exc, AnswerRefused) else "hook failed"
        log.error(what, hook=exc.hook, error=str(exc), code=code.name)
        await self._abort(context, code, str(exc))


def ids_problem(ids: Sequence[str]) -> str | None:
    """A container's device IDs: at least one, no repeats."""
    if not ids:
        return "a container request names no device IDs"
    if len(set(ids)) != len(ids):
        return "a container request repeats a device ID"
    return None


def hook_status(exc: HookError) -> grpc.StatusCode:
    """The status that says what happened to a hook: hung, no thread free, or raised/answered wrongly."""
    if isinstance(exc, HookTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, BackendBusy):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, AnswerRefused):
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN
