"""Hostile input: random, huge, malformed and non-HTTP/2 bytes sent to a running host's sockets.

Each request body is checked against an oracle: the exact status the host must answer (OK,
INVALID_ARGUMENT naming the problem, RESOURCE_EXHAUSTED past grpc's 4 MiB limit, UNKNOWN with
protobuf's parse error, which is how grpc.aio answers an undecodable request). The host runs
on an event loop of its own thread, so hypothesis drives it from plain synchronous tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from faultkit import Ledger, allocate_request, open_fds, preferred_request, prestart_request
from google.protobuf.message import DecodeError, Message
from hostfakes import TopologyBackend, running_host, widgets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicehost.host.backends.threads import MAX_THREADS_PER_BACKEND
from devicehost.host.daemon import Host
from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(900)

NAME = "example.com/hostile"
OTHER = "example.com/bystander"
KNOWN = [f"w{n}" for n in range(16)]
MAX_MESSAGE = 4 * 1024 * 1024
"""grpc's default limit on a received message."""
MAX_DETAILS = 16 * 1024
"""Error details stay this short whatever the request held."""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CLASSES = ("valid", "empty", "duplicates", "unknown", "thousands", "huge", "non-UTF-8", "garbage")
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
T = TypeVar("T")


@dataclass(frozen=True)
class Expected:
    """The status an input must get and a fragment its details must contain."""

    code: grpc.StatusCode
    fragment: str = ""


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    body: bytes


class HostThread:
    """The real Host and a kubelet stand-in on an event loop of their own thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.backend = TopologyBackend(widgets(NAME, len(KNOWN)), widgets(OTHER, 2))
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hostile-host", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.host: Host | None = None
        self.kubelet: KubeletStandIn | None = None

    def __enter__(self) -> HostThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the host did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the host thread did not end"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the test thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with (
            KubeletStandIn(self.directory) as kubelet,
            running_host(self.directory, {"topo": self.backend}) as host,
        ):
            self.kubelet, self.host = kubelet, host
            await kubelet.wait_for_resource(NAME, healthy=len(KNOWN))
            await kubelet.wait_for_resource(OTHER, healthy=2)
            for name, server in host.resources.items():
                self._channels[name] = grpc.aio.insecure_channel(f"unix:{server.socket.path}")
            self._ready.set()
            await self._stop.wait()
            for channel in self._channels.values():
                await channel.close(None)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coro`` on the host's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def socket_paths(self) -> list[Path]:
        assert self.host is not None
        return [server.socket.path for server in self.host.resources.values()]

    async def raw(self, method: str, body: bytes) -> Answer:
        """Call ``method`` of the hostile resource with ``body`` as the serialized request."""
        call = self._channels[NAME].unary_unary(
            f"/v1beta1.DevicePlugin/{method}", request_serializer=None, response_deserializer=None
        )
        try:
            answer = await call(body, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return Answer(exc.code(), exc.details() or "", b"")
        assert isinstance(answer, bytes)
        return Answer(OK, "", answer)

    async def task_count(self) -> int:
        return len(asyncio.all_tasks())

    async def admit_one(self) -> tuple[str, ...]:
        """A normal admission as the kubelet makes it; the devices are freed again."""
        assert self.kubelet is not None
        result = await self.kubelet.allocate(NAME, 2)
        self.kubelet.release(NAME)
        assert dict(result.response.container_responses[0].envs) == {"IDS": ",".join(result.device_ids)}
        return result.device_ids


@pytest.fixture(scope="module")
def target() -> Iterator[HostThread]:
    """One host for the module (short socket paths: /tmp, not pytest's tmp dir)."""
    root = Path(tempfile.mkdtemp(prefix="dh-", dir="/tmp"))
    try:
        with HostThread(root / "dp") as host:
            yield host
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def examples(long_mode: bool) -> int:
    """Hypothesis examples per input class and method."""
    return 120 if long_mode else 25


# -- strategies: lists of device IDs by input class ----------------------------------------------

unknown_id = st.text(max_size=40).filter(lambda i: i not in KNOWN)
known_id = st.sampled_from(KNOWN)


@st.composite
def id_list(draw: st.DrawFn, kind: str) -> list[str]:
    """Device IDs of one container for input class ``kind`` (text classes only)."""
    if kind == "valid":
        return draw(st.lists(known_id, min_size=1, unique=True))
    if kind == "empty":
        return []
    if kind == "duplicates":
        ids = draw(st.lists(known_id, min_size=1, unique=True))
        twice = draw(st.sampled_from(ids))
        return draw(st.permutations([*ids, twice]))
    if kind == "unknown":
        return draw(st.lists(st.one_of(known_id, unknown_id), min_size=1, max_size=12).filter(_has_unknown))
    if kind == "thousands":
        rnd = draw(st.randoms(use_true_random=False))
        count = draw(st.integers(1000, 5000))
        pool = KNOWN if draw(st.booleans()) else [*KNOWN, *(f"u{n}" for n in range(count))]
        return [rnd.choice(pool) for _ in range(count)]
    if kind == "huge":
        size = draw(st.integers(1 << 20, 6 << 20))
        return [*draw(st.lists(known_id, max_size=3, unique=True)), draw(st.sampled_from("xé\x00")) * size]
    raise AssertionError(kind)


def _has_unknown(ids: list[str]) -> bool:
    return any(i not in KNOWN for i in ids)


@st.composite
def bad_utf8(draw: st.DrawFn) -> bytes:
    """A device ID whose bytes are not UTF-8."""
    head = draw(st.text(max_size=8)).encode()
    bad = draw(
        st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xc0"])
    )
    return head + bad + draw(st.binary(max_size=8))


@st.composite
def raw_ids(draw: st.DrawFn) -> list[bytes]:
    """Known IDs with at least one non-UTF-8 one among them, as bytes."""
    ids = [i.encode() for i in draw(st.lists(known_id, max_size=4, unique=True))]
    ids.insert(draw(st.integers(0, len(ids))), draw(bad_utf8()))
    return ids


def allocate_bodies(kind: str) -> st.SearchStrategy[bytes]:
    if kind == "non-UTF-8":
        return st.lists(raw_ids(), min_size=1, max_size=3).map(allocate_request)
    if kind == "garbage":
        return st.binary(max_size=512)
    containers = st.lists(id_list(kind), min_size=1, max_size=2 if kind in ("huge", "thousands") else 4)
    if kind == "empty":
        containers = st.one_of(
            st.just([]), st.lists(st.one_of(id_list("valid"), id_list("empty")), min_size=1)
        )
    return containers.map(
        lambda cs: api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in cs]
        ).SerializeToString()
    )


def prestart_bodies(kind: str) -> st.SearchStrategy[bytes]:
    if kind == "non-UTF-8":
        return raw_ids().map(prestart_request)
    if kind == "garbage":
        return st.binary(max_size=512)
    return id_list(kind).map(
        lambda ids: api_pb2.PreStartContainerRequest(devices_ids=ids).SerializeToString()
    )


@st.composite
def preferred_container(draw: st.DrawFn, kind: str) -> tuple[list[str], list[str], int]:
    """available, must-include and size of one container for input class ``kind``."""
    if kind == "valid":
        available = draw(st.lists(known_id, unique=True))
        must = draw(st.lists(st.sampled_from(available), unique=True)) if available else []
        return available, must, draw(st.integers(len(must), len(available)))
    available = draw(id_list(kind))
    must = draw(
        st.one_of(st.just([]), id_list(kind), st.lists(st.sampled_from(available or KNOWN), max_size=3))
    )
    return available, must, draw(st.integers(-3, len(available) + 3))


def preferred_bodies(kind: str) -> st.SearchStrategy[bytes]:
    if kind == "non-UTF-8":
        return st.lists(
            st.tuples(raw_ids(), st.lists(known_id.map(str.encode), max_size=2), st.integers(0, 4)),
            min_size=1,
            max_size=3,
        ).map(preferred_request)
    if kind == "garbage":
        return st.binary(max_size=512)
    containers = st.lists(preferred_container(kind), min_size=0 if kind == "empty" else 1, max_size=3)
    return containers.map(
        lambda cs: api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=s
                )
                for a, m, s in cs
            ]
        ).SerializeToString()
    )


# -- the oracle ------------------------------------------------------------------------------------


def _parse(message: type[Message], body: bytes) -> Message | Expected:
    if len(body) > MAX_MESSAGE:
        return Expected(grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")
    try:
        return message.FromString(body)
    except DecodeError:
        return Expected(
            grpc.StatusCode.UNKNOWN, f"Error parsing message with type 'v1beta1.{message.__name__}'"
        )


def _ids_problem(ids: list[str]) -> Expected | None:
    """What the host must say about one container's IDs (first problem wins), or None."""
    if not ids:
        return Expected(INVALID, "a container request names no device IDs")
    if len(set(ids)) != len(ids):
        return Expected(INVALID, "a container request repeats a device ID")
    return _unknown_problem(ids)


def _unknown_problem(ids: list[str]) -> Expected | None:
    unknown = [i for i in ids if i not in KNOWN]
    if unknown:
        return Expected(INVALID, f"unknown device IDs for {NAME}: {unknown[0][:80]!r}")
    return None


def expect_allocate(body: bytes) -> Expected:
    request = _parse(api_pb2.AllocateRequest, body)
    if isinstance(request, Expected):
        return request
    assert isinstance(request, api_pb2.AllocateRequest)
    if not request.container_requests:
        return Expected(INVALID, "AllocateRequest has no container requests")
    for container in request.container_requests:
        problem = _ids_problem(list(container.devices_ids))
        if problem:
            return problem
    return Expected(OK)


def expect_prestart(body: bytes) -> Expected:
    request = _parse(api_pb2.PreStartContainerRequest, body)
    if isinstance(request, Expected):
        return request
    assert isinstance(request, api_pb2.PreStartContainerRequest)
    return _ids_problem(list(request.devices_ids)) or Expected(OK)


def expect_preferred(body: bytes) -> Expected:
    request = _parse(api_pb2.PreferredAllocationRequest, body)
    if isinstance(request, Expected):
        return request
    assert isinstance(request, api_pb2.PreferredAllocationRequest)
    for c in request.container_requests:
        available, must = (
            list(dict.fromkeys(c.available_deviceIDs)),
            list(dict.fromkeys(c.must_include_deviceIDs)),
        )
        problem = _unknown_problem(list(dict.fromkeys([*available, *must])))
        if problem:
            return problem
        if not set(must) <= set(available) or not len(must) <= c.allocation_size <= len(available):
            return Expected(INVALID, f"cannot pick {c.allocation_size} of {len(available)} available devices")
    return Expected(OK)


def check_allocate_answer(body: bytes, answer: bytes) -> None:
    request = api_pb2.AllocateRequest.FromString(body)
    response = api_pb2.AllocateResponse.FromString(answer)
    assert len(response.container_responses) == len(request.container_requests)
    for asked, given_ in zip(request.container_requests, response.container_responses, strict=True):
        assert dict(given_.envs) == {"IDS": ",".join(asked.devices_ids)}
        assert [d.container_path for d in given_.devices] == [f"/dev/{i}" for i in asked.devices_ids]


def check_preferred_answer(body: bytes, answer: bytes) -> None:
    request = api_pb2.PreferredAllocationRequest.FromString(body)
    response = api_pb2.PreferredAllocationResponse.FromString(answer)
    assert len(response.container_responses) == len(request.container_requests)
    for asked, given_ in zip(request.container_requests, response.container_responses, strict=True):
        ids = list(given_.deviceIDs)
        assert len(ids) == len(set(ids)) == asked.allocation_size
        assert set(asked.must_include_deviceIDs) <= set(ids) <= set(asked.available_deviceIDs)


def check_prestart_answer(body: bytes, answer: bytes) -> None:
    assert answer == b"", "PreStartContainerResponse has no fields"


METHODS: dict[
    str,
    tuple[
        Callable[[str], st.SearchStrategy[bytes]], Callable[[bytes], Expected], Callable[[bytes, bytes], None]
    ],
] = {
    "Allocate": (allocate_bodies, expect_allocate, check_allocate_answer),
    "GetPreferredAllocation": (preferred_bodies, expect_preferred, check_preferred_answer),
    "PreStartContainer": (prestart_bodies, expect_prestart, check_prestart_answer),
}


def oversized(method: str, size: int) -> bytes:
    """A request of exactly ``size`` bytes whose one device ID is a long run of ``x``."""
    for pad in range(size - 16, size):
        ids = [b"x" * pad]
        body = (
            allocate_request([ids])
            if method == "Allocate"
            else prestart_request(ids)
            if method == "PreStartContainer"
            else preferred_request([(ids, [], 1)])
        )
        if len(body) == size:
            return body
    raise AssertionError(f"no {method} body of {size} bytes")


# -- leak checks -----------------------------------------------------------------------------------


def settle(condition: Callable[[], bool], timeout: float = 5) -> bool:
    """Poll ``condition`` every 10 ms for up to ``timeout`` seconds; whether it came to hold."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@dataclass
class Baseline:
    tasks: int
    threads: int
    fds: int

    @classmethod
    def take(cls, target: HostThread) -> Baseline:
        return cls(target.call(target.task_count()), threading.active_count(), open_fds())

    def check(self, target: HostThread) -> None:
        """Still serving a normal admission; tasks, threads and fds back where they were."""
        devices = target.call(target.admit_one())
        assert len(devices) == 2
        assert target.kubelet is not None
        assert target.kubelet.registrations(NAME) == 1, "the stream dropped"
        assert settle(lambda: target.call(target.task_count()) <= self.tasks), (
            f"tasks: {self.tasks} before, {target.call(target.task_count())} after"
        )
        assert threading.active_count() <= self.threads + MAX_THREADS_PER_BACKEND
        assert settle(lambda: open_fds() <= self.fds + 4), f"fds: {self.fds} before, {open_fds()} after"


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(METHODS))
def test_every_request_gets_ok_or_a_precise_error(
    target: HostThread, method: str, examples: int, ledger: Ledger
) -> None:
    """Random, empty, duplicate, unknown, thousands, huge, non-UTF-8 and garbage bodies: each
    answered exactly as the oracle says, OK answers well formed, and nothing leaked."""
    bodies, expect, check_answer = METHODS[method]
    target.call(target.admit_one())  # warm up channels and pools before the baseline
    baseline = Baseline.take(target)
    tried: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for kind in CLASSES:
        count_as = kind

        @settings(
            max_examples=max(3, examples // 4) if kind == "huge" else examples,
            deadline=None,
            database=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.large_base_example,
            ],
        )
        @given(body=bodies(kind))
        def check(body: bytes) -> None:
            wanted = expect(body)
            answer = target.call(target.raw(method, body))
            tried[count_as] += 1  # noqa: B023 - check() runs within this iteration
            seen[answer.code.name] += 1
            why = (method, wanted, answer.code, answer.details[:300])
            assert answer.code == wanted.code, why
            assert wanted.fragment in answer.details, why
            assert len(answer.details) <= MAX_DETAILS
            if answer.code == OK:
                check_answer(body, answer.body)

        check()
    assert set(tried) == set(CLASSES)
    assert seen[INVALID.name] > 0
    assert seen[OK.name] > 0
    for size in (MAX_MESSAGE, MAX_MESSAGE + 1):  # grpc's limit, exactly
        body = oversized(method, size)
        answer = target.call(target.raw(method, body))
        assert answer.code == expect(body).code
        assert len(answer.details) <= MAX_DETAILS
        seen[answer.code.name] += 1
    assert seen["RESOURCE_EXHAUSTED"] > 0
    baseline.check(target)
    for kind, count in tried.items():
        ledger.add(f"hostile requests tried: {kind}", count)
    for code, count in seen.items():
        ledger.add(f"hostile requests answered {code}", count)


@st.composite
def garbage_stream(draw: st.DrawFn) -> tuple[str, bytes]:
    """Bytes that are not HTTP/2, an HTTP/2 preface followed by garbage, or a cut preface."""
    kind = draw(st.sampled_from(["not HTTP/2", "preface then garbage", "cut preface"]))
    if kind == "not HTTP/2":
        return kind, draw(
            st.binary(min_size=1, max_size=4096).filter(lambda b: not PREFACE.startswith(b[:24]))
        )
    if kind == "preface then garbage":
        return kind, PREFACE + draw(st.binary(min_size=1, max_size=4096))
    return kind, PREFACE[: draw(st.integers(1, len(PREFACE) - 1))]


async def write_raw(path: Path, data: bytes, half_close: bool) -> bytes:
    """Write ``data`` to the unix socket ``path``; return what came back before the host closed it."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)  # raises TimeoutError if never closed
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def test_raw_garbage_on_each_socket_is_closed_and_harmless(
    target: HostThread, examples: int, ledger: Ledger
) -> None:
    """Non-HTTP/2 bytes get the connection closed by the host (at once, or at our end of input);
    whatever it sent first is an HTTP/2 SETTINGS frame; the host serves on afterwards."""
    target.call(target.admit_one())
    baseline = Baseline.take(target)
    tried: Counter[str] = Counter()
    paths = target.socket_paths()
    assert len(paths) == 2

    @settings(max_examples=examples * 4, deadline=None, database=None)
    @given(stream=garbage_stream(), which=st.sampled_from(paths))
    def check(stream: tuple[str, bytes], which: Path) -> None:
        kind, data = stream
        reply = target.call(write_raw(which, data, half_close=kind != "not HTTP/2"))
        assert reply == b"" or reply[3] == 0x04, reply[:16]  # frame type 4: SETTINGS
        tried[kind] += 1

    check()
    assert set(tried) == {"not HTTP/2", "preface then garbage", "cut preface"}
    baseline.check(target)
    allocate = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["w0"])]
    ).SerializeToString()
    assert target.call(target.raw("Allocate", allocate)).code == OK
    ledger.add("garbage byte streams written to sockets", sum(tried.values()))
