"""The host context: what every long-lived part of one host start reads its settings from.

The composition root (:func:`devicehost.host.app.compose`) makes one :class:`HostContext` and
hands it to each part it builds. A part reads a setting here when it uses it, never keeping a
copy, so a reload that puts a new configuration here (settings marked ``IN_PLACE``) reaches every
part at its next use: the discovery loop, each resource's health poll (at once, through
:meth:`HostContext.sleep`), the Register calls, every backend's hook calls, and the DRA drivers'
claims.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from devicehost.hookspecs.types import HostFacts
from devicehost.host.config import HostConfig


class HostContext:
    """The live configuration of one host start, and the facts a backend is told."""

    def __init__(self, config: HostConfig) -> None:
        self._config = config
        self._facts = HostFacts(node_name=config.node_name, cdi_dir=config.cdi_dir)
        self._replaced = asyncio.Event()

    @property
    def config(self) -> HostConfig:
        """The configuration in force: a reload replaces it (its ``NEXT_START`` settings kept)."""
        return self._config

    @config.setter
    def config(self, config: HostConfig) -> None:
        self._config = config
        facts = HostFacts(node_name=config.node_name, cdi_dir=config.cdi_dir)
        if facts != self._facts:
            self._facts = facts
        self._replaced.set()  # wakes every sleep below, which reads its time again
        self._replaced = asyncio.Event()

    @property
    def node_name(self) -> str:
        """The node this host serves ("" when the operator gave none)."""
        return self._config.node_name

    def facts(self) -> HostFacts:
        """What backends are told (``devicehost_host_facts``): the node's name, the dirs they may
        write; the same object until a fact changes (hook calls compare it by identity)."""
        return self._facts

    async def sleep(self, seconds: Callable[[HostConfig], float]) -> None:
        """Sleep ``seconds(config)`` from now; a reload that changes it shortens or lengthens the
        sleep at once (a poll whose interval went from 30 s to 1 s does not sleep 30 s first)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (left := started + seconds(self._config) - loop.time()) > 0:
            replaced = self._replaced
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await replaced.wait()
