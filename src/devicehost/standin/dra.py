"""The kubelet's DRA manager (kubelet 1.34+): drivers registered through the plugin watcher, and
the ``NodePrepareResources`` / ``NodeUnprepareResources`` calls the kubelet makes to them.

A DRA driver registers with a socket in ``plugins_registry`` whose ``GetInfo`` says type
``DRAPlugin``, its driver name, its DRAPlugin endpoint and the gRPC services it offers (which
must include ``v1.DRAPlugin``). A driver may have several endpoints at once (a rolling update):
the kubelet refuses only an endpoint already registered for the same driver, calls the newest
connected one, and forgets an endpoint when its registration socket goes. Every claim asked
for must come back in the answer, without an error, or the kubelet fails the pod's preparation.
Where its Kubernetes version's kubelet does (:mod:`.versions`), it opens each driver's health
stream and shows a prepared device's health as a pod's ``allocatedResourcesStatus``
(:mod:`.dra_health`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc
from devicehost.standin.connection import CHANNEL_OPTIONS
from devicehost.standin.dra_health import DraHealth
from devicehost.standin.events import EventLog
from devicehost.standin.model import DraCallError, DraDevice, EventKind
from devicehost.standin.versions import parse

PLUGIN_TYPE = "DRAPlugin"
SERVICE = "v1.DRAPlugin"
SUPPORTED_SERVICES = (SERVICE,)
"""The DRAPlugin services this kubelet calls (1.34 also calls ``v1beta1.DRAPlugin``; the stand-in
speaks only ``v1``)."""
CALL_TIMEOUT = 45.0
"""The kubelet's deadline for each DRA call (``defaultClientCallTimeout``)."""

ClaimRef = tuple[str, str, str]
"""(namespace, uid, name), as the kubelet names a claim."""


def _go_list(values: Sequence[str]) -> str:
    """A string slice as Go's ``%q`` prints it."""
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def _go_code(code: grpc.StatusCode) -> str:
    """A status code as Go's grpc names it (``DEADLINE_EXCEEDED`` -> ``DeadlineExceeded``)."""
    return "".join(part.capitalize() for part in code.name.split("_"))


def validation_problem(name: str, endpoint: str, versions: Sequence[str]) -> str | None:
    """The DRA handler's ``ValidatePlugin``, as kubelet text, or ``None``."""
    if not name:
        return "DRA driver name is empty"
    prefix = f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: "
    if not versions:
        return prefix + "empty list of supported gRPC services (aka supported versions)"
    if not any(v in SUPPORTED_SERVICES for v in versions):
        return prefix + (
            f"none of services supported by the plugin ({_go_list(versions)}) "
            f"are supported by the kubelet ({_go_list(SUPPORTED_SERVICES)})"
        )
    return None


@dataclass
class DraPlugin:
    """One registered endpoint of a driver and the kubelet's channel to it."""

    driver: str
    endpoint: str
    channel: grpc.aio.Channel

    @property
    def connected(self) -> bool:
        return self.channel.get_state() == grpc.ChannelConnectivity.READY


class DraManager:
    """DRA drivers by name, and the two calls the kubelet makes to them.

    Calls take a ``timeout`` (default: the manager's ``call_timeout``, the kubelet's 45 s).
    Every outcome is an event of the driver: ``registered``, ``register-failed``,
    ``deregistered``, ``disconnected``, ``prepared``, ``prepare-failed``, ``unprepared``,
    ``unprepare-failed``; health streams and pod status: ``health``, as ``version`` has them.
    """

    def __init__(self, events: EventLog, call_timeout: float = CALL_TIMEOUT, version: str = "1.35") -> None:
        self._events = events
        self.call_timeout = call_timeout
        self._plugins: dict[str, list[DraPlugin]] = {}
        self.health = DraHealth(events.emit, parse(version))

    @property
    def drivers(self) -> list[str]:
        """Names of the registered drivers, sorted."""
        return sorted(self._plugins)

    def endpoints(self, driver: str) -> list[str]:
        """The driver's registered endpoints, oldest first (none: not registered)."""
        return [p.endpoint for p in self._plugins.get(driver, [])]

    async def wait_for_driver(self, driver: str, timeout: float = 10) -> str:  # noqa: ASYNC109
        """Wait until ``driver`` is registered; its newest endpoint. ``AssertionError`` saying
        what was seen when it is not within ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                await self._events.wait_until(lambda: driver in self._plugins)
        except TimeoutError:
            raise AssertionError(
                f"DRA driver {driver} not registered within {timeout}s (registered: {self.drivers}); "
                f"last events: {self._events.recent(driver)}"
            ) from None
        return self._plugins[driver][-1].endpoint

    # -- the plugin watcher's handler ----------------------------------------------------------

    async def register(self, driver: str, endpoint: str) -> str | None:
        """Record ``endpoint`` for ``driver`` and start connecting; the kubelet's error, if any."""
        plugins = self._plugins.setdefault(driver, [])
        if any(p.endpoint == endpoint for p in plugins):
            return f"endpoint {endpoint} already registered for DRA driver plugin {driver}"
        channel = grpc.aio.insecure_channel(f"unix:{endpoint}", options=CHANNEL_OPTIONS)
        channel.get_state(try_to_connect=True)  # as the kubelet's conn.Connect(): connect early
        plugins.append(DraPlugin(driver, endpoint, channel))
        self.health.watch(driver, endpoint, channel)
        self._events.emit(
            EventKind.REGISTERED, driver, f"DRA driver endpoint {endpoint} ({len(plugins)} registered)"
        )
        return None

    async def deregister(self, driver: str, endpoint: str) -> None:
        """Forget one endpoint (its registration socket went away) and close its channel."""
        plugins = self._plugins.get(driver, [])
        gone = [p for p in plugins if p.endpoint == endpoint]
        if not gone:
            return
        plugins.remove(gone[0])
        if not plugins:
            del self._plugins[driver]
        await self.health.stop(endpoint)
        await gone[0].channel.close(None)
        self._events.emit(EventKind.DEREGISTERED, driver, f"plugin socket removed (endpoint {endpoint})")

    async def disconnect_all(self, reason: str) -> None:
        """Forget every driver (the kubelet keeps them in memory only); each must register again."""
        plugins, self._plugins = self._plugins, {}
        await self.health.stop_all()
        for driver, registered in sorted(plugins.items()):
            for plugin in registered:
                await plugin.channel.close(None)
            self._events.emit(EventKind.DISCONNECTED, driver, reason)

    # -- the calls -----------------------------------------------------------------------------

    async def prepare(
        self,
        driver: str,
        claims: Sequence[ClaimRef],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> dict[str, tuple[DraDevice, ...]]:
        """NodePrepareResources for ``claims`` as the kubelet calls it: each claim's devices by UID.

        Raises :class:`DraCallError` with the kubelet's text when the driver is not registered,
        the call fails or times out, a claim comes back with an error, or one does not come back.
        """
        request = api_pb2.NodePrepareResourcesRequest(claims=_claims(claims))
        method = "NodePrepareResources"
        response = await self._call(driver, method, request, timeout, EventKind.PREPARE_FAILED)
        self._check(driver, method, claims, response.claims, EventKind.PREPARE_FAILED)
        prepared = {
            uid: tuple(map(DraDevice.from_proto, response.claims[uid].devices)) for _, uid, _ in claims
        }
        self.health.prepared(driver, claims, prepared)
        detail = "; ".join(
            f"{ns}/{name}: " + ", ".join(f"{d.pool}/{d.device}" for d in prepared[uid])
            for ns, uid, name in claims
        )
        self._events.emit(EventKind.PREPARED, driver, detail)
        return prepared

    async def unprepare(
        self,
        driver: str,
        claims: Sequence[ClaimRef],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """NodeUnprepareResources for ``claims`` as the kubelet calls it (errors as :meth:`prepare`)."""
        request = api_pb2.NodeUnprepareResourcesRequest(claims=_claims(claims))
        method = "NodeUnprepareResources"
        response = await self._call(driver, method, request, timeout, EventKind.UNPREPARE_FAILED)
        self._check(driver, method, claims, response.claims, EventKind.UNPREPARE_FAILED)
        self.health.unprepared(claims)
        self._events.emit(EventKind.UNPREPARED, driver, ", ".join(f"{ns}/{name}" for ns, _, name in claims))

    def _pick(self, driver: str) -> DraPlugin | None:
        """The newest connected endpoint, else the newest (as the kubelet picks)."""
        plugins = self._plugins.get(driver, [])
        connected = [p for p in plugins if p.connected]
        candidates = connected or plugins
        return candidates[-1] if candidates else None

    async def _call(
        self, driver: str, method: str, request: Any, deadline: float | None, failed: EventKind
    ) -> Any:
        plugin = self._pick(driver)
        if plugin is None:
            self._fail(driver, failed, f"DRA driver {driver} is not registered")
        stub = api_pb2_grpc.DRAPluginStub(plugin.channel)
        try:
            return await getattr(stub, method)(request, timeout=deadline or self.call_timeout)
        except grpc.aio.AioRpcError as exc:
            code = _go_code(exc.code())
            self._fail(driver, failed, f"{method}: rpc error: code = {code} desc = {exc.details()}")

    def _check(
        self, driver: str, method: str, claims: Sequence[ClaimRef], answers: Any, failed: EventKind
    ) -> None:
        problems = result_problems(method, claims, answers)
        if problems:
            self._fail(driver, failed, "; ".join(problems))

    def _fail(self, driver: str, kind: EventKind, message: str) -> NoReturn:
        self._events.emit(kind, driver, message)
        raise DraCallError(message)


def result_problems(method: str, claims: Sequence[ClaimRef], answers: Mapping[str, Any]) -> list[str]:
    """What the kubelet refuses in an answer (its text): a claim not asked for, a claim's error,
    claims left out."""
    asked = {uid: (ns, name) for ns, uid, name in claims}
    problems = [
        f"{method} returned result for unknown claim UID {uid}" for uid in answers if uid not in asked
    ]
    problems += [
        f"{method} failed for claim {ns}/{name}: {answers[uid].error}"
        for uid, (ns, name) in asked.items()
        if uid in answers and answers[uid].error
    ]
    missing = [f"{ns}/{name}" for uid, (ns, name) in asked.items() if uid not in answers]
    if missing:
        problems.append(f"{method} left out {len(missing)} claims ({', '.join(missing)})")
    return problems


def _claims(claims: Sequence[ClaimRef]) -> list[api_pb2.Claim]:
    return [api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
