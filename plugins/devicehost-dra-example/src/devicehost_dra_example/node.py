"""What both profiles take from the node: its name, and device UUIDs seeded by it."""

from __future__ import annotations

import random
import socket
import uuid


def node_name(setting: str | None, told: str) -> str:
    """The ``node_name`` setting, else the node the host told (``HostFacts.node_name``), else the host name."""
    return setting or told or socket.gethostname()


def seeded_uuids(seed: str, prefix: str, count: int) -> list[str]:
    """``<prefix>-<uuid>`` for ``count`` devices, the same on every start for the same ``seed``."""
    rng = random.Random(seed)
    return [f"{prefix}-{uuid.UUID(bytes=rng.randbytes(16))}" for _ in range(count)]
