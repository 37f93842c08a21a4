"""Reading the host's probe endpoints in tests: a free port, a GET, a metric's value."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of ``GET http://127.0.0.1:<port><path>``, error statuses included."""

    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return await asyncio.to_thread(fetch)


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 if absent)."""
    for line in metrics.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and all(f'{k}="{v}"' in match[1] for k, v in labels.items()):
            return float(match[2])
    return 0.0
