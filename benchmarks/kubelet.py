"""The kubelet stand-in as the benchmark's client: arrival stamps and waits over many resources."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from devicehost.proto.deviceplugin.v1beta1 import api_pb2
from devicehost.standin import KubeletStandIn

Arrival = tuple[float, api_pb2.ListAndWatchResponse]


class TimedKubelet(KubeletStandIn):
    """Stamps ListAndWatch messages of watched resources with ``time.monotonic()`` as they arrive,
    before the stand-in converts them (which costs the same for every server under test)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._arrivals: dict[str, asyncio.Queue[Arrival]] = {}
        self.observe_lists(self._stamp)

    @property
    def socket_created_at(self) -> float | None:
        """``time.monotonic()`` when the current ``kubelet.sock`` file appeared (before it listened)."""
        return self._socket.created_at

    def watch(self, name: str) -> asyncio.Queue[Arrival]:
        """The queue of ``(arrived, message)`` for ``name``, from now on."""
        return self._arrivals.setdefault(name, asyncio.Queue())

    def _stamp(self, resource: str, response: api_pb2.ListAndWatchResponse) -> None:
        queue = self._arrivals.get(resource)
        if queue is not None:
            queue.put_nowait((time.monotonic(), response))


async def wait_all(kubelet: KubeletStandIn, names: Iterable[str], timeout: float) -> float:  # noqa: ASYNC109
    """Wait until every resource is registered and streaming; the ``time.monotonic()`` when it was."""
    deadline = time.monotonic() + timeout
    for name in names:
        await kubelet.wait_for_resource(name, timeout=max(0.0, deadline - time.monotonic()))
    return time.monotonic()


async def wait_some(
    kubelet: KubeletStandIn,
    names: list[str],
    timeout: float,  # noqa: ASYNC109
) -> tuple[float | None, list[str]]:
    """Like :func:`wait_all`, but a server that misses ``timeout`` is a result, not an error:
    the time all were registered (None if not all were) and the names registered by then."""
    try:
        return await wait_all(kubelet, names, timeout), list(names)
    except AssertionError:
        return None, [n for n in names if n in kubelet.resources and kubelet.view(n).connected]
