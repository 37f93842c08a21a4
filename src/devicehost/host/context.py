"""The host context: what every long-lived part of one host start reads its settings from.

The composition root (:func:`devicehost.host.app.running`) makes one :class:`HostContext` and
hands it to each part it builds. A part reads a setting here when it uses it, never keeping a
copy, so a reload that puts a new configuration here (settings marked ``IN_PLACE``) reaches every
part at its next use: the discovery loop, each resource's health poll, the Register calls, every
backend's hook calls, and the DRA drivers' claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devicehost.hookspecs.types import HostFacts
from devicehost.host.config import HostConfig


@dataclass(eq=False)
class HostContext:
    """The live configuration of one host start, and the facts a backend is told."""

    config: HostConfig
    """The configuration in force: a reload replaces it (its ``NEXT_START`` settings kept)."""
    _facts: tuple[HostConfig, HostFacts] | None = field(default=None, init=False, repr=False)

    @property
    def node_name(self) -> str:
        """The node this host serves ("" when the operator gave none)."""
        return self.config.node_name

    def facts(self) -> HostFacts:
        """What backends are told (``devicehost_host_facts``): the node's name, the dirs they may
        write; the same object until a fact changes (hook calls compare it by identity)."""
        config = self.config
        if self._facts is None or self._facts[0] is not config:
            facts = HostFacts(node_name=config.node_name, cdi_dir=config.cdi_dir)
            self._facts = (config, self._facts[1] if self._facts and self._facts[1] == facts else facts)
        return self._facts[1]
