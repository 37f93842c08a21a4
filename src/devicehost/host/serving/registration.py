"""How a resource gets registered with the kubelet: the small interfaces between its parts.

Two registrations exist, chosen once per host start (:func:`devicehost.host.serving.mode.for_mode`):
``Register`` on ``kubelet.sock`` (:mod:`~devicehost.host.serving.kubelet_registrar`) and a socket in
the kubelet's ``plugins_registry`` dir (:mod:`~devicehost.host.serving.watcher_registrar`). Each
makes one :class:`Registrar` per resource. A registrar sees its resource only as an
:class:`Endpoint`, and the kubelet only as a :class:`SocketWatch` and a :class:`RegisterClient`,
so tests drive it with fakes of all three.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from structlog.typing import FilteringBoundLogger

from devicehost.host.serving.socket import ServedSocket
from devicehost.host.serving.streams import StreamSet
from devicehost.proto.deviceplugin.v1beta1 import api_pb2

BACKOFF_INITIAL = 0.02
"""Seconds before the first retry (jittered down to half): a kubelet still starting is retried at once."""
BACKOFF_MAX = 5.0
"""The longest wait between two tries of one resource."""
STABLE_AFTER = 1.0
"""Seconds a registration must hold before its loss counts as news rather than one more failure."""


class Backoff:
    """Capped, jittered, doubling delays between the tries of one resource, and the last problem.

    ``fail()`` tells whether the problem differs from the last one, so that the caller logs once
    per change, not once per try.
    """

    def __init__(self, initial: float = BACKOFF_INITIAL, cap: float = BACKOFF_MAX) -> None:
        self.initial = initial
        self.cap = cap
        self.failures = 0
        """Failed tries since the last success or reset."""
        self.problem: str | None = None

    def fail(self, problem: str) -> tuple[float, bool]:
        """Count a failed try: the seconds to wait before the next, and whether ``problem`` is new."""
        base = min(self.initial * 2 ** min(self.failures, 32), self.cap)
        self.failures += 1
        changed = problem != self.problem
        self.problem = problem
        return random.uniform(base / 2, base), changed

    def reset(self) -> int:
        """Start again from the shortest delay (a success, or a new kubelet); the failures before."""
        failures, self.failures, self.problem = self.failures, 0, None
        return failures


class SocketWatch(Protocol):
    """What a registrar reads of ``kubelet.sock`` (:class:`~devicehost.host.kubelet.socket_watch.KubeletSocketWatch`)."""

    @property
    def kubelet_socket(self) -> Path: ...
    @property
    def inode(self) -> int | None: ...
    @property
    def generation(self) -> int: ...
    async def wait_present(self) -> int: ...
    def subscribe(self, callback: Callable[[str | None], None]) -> None: ...
    def unsubscribe(self, callback: Callable[[str | None], None]) -> None: ...


class RegisterClient(Protocol):
    """The kubelet's ``Register`` (:class:`~devicehost.host.kubelet.client.KubeletClient`)."""

    async def register(self, resource: str, endpoint: str, options: api_pb2.DevicePluginOptions) -> None: ...


class Endpoint(Protocol):
    """What a registrar sees of the resource it registers."""

    name: str
    socket: ServedSocket
    streams: StreamSet
    log: FilteringBoundLogger

    @property
    def options(self) -> api_pb2.DevicePluginOptions: ...
    async def serve_again(self) -> None:
        """Stop serving the socket and serve a fresh one."""


@dataclass
class RegistrationStats:
    """Successful registrations of one resource."""

    reasons: Counter[str] = field(default_factory=Counter)
    """Registrations by reason: start, kubelet appeared, kubelet restarted, stream lost, ..."""
    last_seconds: float | None = None
    """How long the last registration took."""
    failed_tries: int = 0
    """Tries that failed (Register refused, or the stream lost soon after), over the resource's life."""

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def record(self, reason: str, seconds: float) -> None:
        self.reasons[reason] += 1
        self.last_seconds = seconds


class Registrar(Protocol):
    """Keeps one resource registered with the kubelet, from ``start()`` until ``stop()``."""

    stats: RegistrationStats

    @property
    def registered(self) -> bool:
        """Registered with the current kubelet and streaming to it."""

    def prepare(self, server: grpc.aio.Server) -> None:
        """Add what this registration serves to a new server of the resource's socket."""

    def start(self) -> None: ...
    async def stop(self) -> None: ...
    def stream_lost(self, epoch: int) -> None:
        """A stream opened in registration ``epoch`` ended on the kubelet's side."""


class Registration(Protocol):
    """How every resource of one host start registers."""

    directory: Path
    """Where the resources' sockets are served."""
    watch: SocketWatch

    def registrar(self, endpoint: Endpoint) -> Registrar: ...


class RegistrarLoop(abc.ABC):
    """What both registrars share: a loop task from ``start()`` to ``stop()``, woken by changes
    in the device-plugins dir and by the loss of a stream of the current registration epoch."""

    def __init__(self, endpoint: Endpoint, watch: SocketWatch) -> None:
        self.stats = RegistrationStats()
        self._endpoint = endpoint
        self._watch = watch
        self._wake = asyncio.Event()
        self._stream_lost = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._watch.subscribe(self._on_dir_change)
        self._task = asyncio.create_task(self._supervise(), name=f"register {self._endpoint.name}")
        self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        self._stopping = True
        self._watch.unsubscribe(self._on_dir_change)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def stream_lost(self, epoch: int) -> None:
        if epoch == self._endpoint.streams.epoch:
            self._stream_lost = True
            self._wake.set()

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless woken first; True when woken."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
                return True
        return False

    @abc.abstractmethod
    def _on_dir_change(self, changed: str | None) -> None:
        """The file ``changed`` in the device-plugins dir changed (None: any may have): wake the
        loop if that concerns it."""

    @abc.abstractmethod
    async def _run(self) -> None:
        """The loop itself; runs until cancelled."""

    async def _supervise(self) -> None:
        """Run the loop until the resource is withdrawn, whatever goes wrong in it (with backoff)."""
        restarts = Backoff()
        while True:
            try:
                await self._run()
            except Exception as exc:
                delay, changed = restarts.fail(f"{type(exc).__name__}: {exc}")
                if changed:
                    self._endpoint.log.exception(
                        "the re-register loop failed; starting it again", retry_in=round(delay, 3)
                    )
                await asyncio.sleep(delay)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not self._stopping:
            how = "cancelled" if task.cancelled() else repr(task.exception())
            self._endpoint.log.error("the re-register loop ended unexpectedly", how=how)
