"""What both profiles take from the node: its name, and device UUIDs seeded by it."""

from __future__ import annotations

import os
import random
import socket
import uuid


def node_name(setting: str | None) -> str:
    """The ``node_name`` setting, else ``$DEVICEHOST_NODE_NAME`` (the host sets it), else the host name."""
    return setting or os.environ.get("DEVICEHOST_NODE_NAME") or socket.gethostname()


def seeded_uuids(seed: str, prefix: str, count: int) -> list[str]:
    """``<prefix>-<uuid>`` for ``count`` devices, the same on every start for the same ``seed``."""
    rng = random.Random(seed)
    return [f"{prefix}-{uuid.UUID(bytes=rng.randbytes(16))}" for _ in range(count)]
