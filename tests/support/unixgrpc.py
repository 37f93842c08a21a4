"""A grpc.aio server on a unix socket of its own temporary dir, and a channel to it."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc


@asynccontextmanager
async def channel_to(server: grpc.aio.Server) -> AsyncIterator[grpc.aio.Channel]:
    """Start ``server`` on a socket under /tmp (a path short enough for a unix socket), yield a
    channel to it, and stop it when the block ends."""
    with tempfile.TemporaryDirectory(prefix="dh-grpc", dir="/tmp") as tmp:
        address = f"unix://{Path(tmp) / 'dra.sock'}"
        server.add_insecure_port(address)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                yield channel
        finally:
            await server.stop(None)
