"""The :class:`devicehost.ResourceNotifier` handed to a backend's start hook.

Thread-safe and fire-and-forget: a backend calls it from any thread, and each call is posted to
the host's loop, where the resource applies it. After the resource is withdrawn, calls are
dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from devicehost.hookspecs.types import Device, Health


class Notifier:
    """Posts a backend's news about one resource to the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        on_health: Callable[[Mapping[str, Health]], None],
        on_devices: Callable[[tuple[Device, ...]], None],
        on_rediscover: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._on_health = on_health
        self._on_devices = on_devices
        self._on_rediscover = on_rediscover
        self._closed = False

    def set_health(self, health: Mapping[str, Health]) -> None:
        self._post(self._on_health, dict(health))

    def set_devices(self, devices: Sequence[Device]) -> None:
        self._post(self._on_devices, tuple(devices))

    def rediscover(self) -> None:
        self._post(self._on_rediscover)

    def close(self) -> None:
        """Drop every later call: the resource is withdrawn."""
        self._closed = True

    def _post(self, function: Callable[..., None], *args: Any) -> None:
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the host is gone
            self._loop.call_soon_threadsafe(function, *args)
