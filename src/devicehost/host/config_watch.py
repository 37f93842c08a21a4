"""Follow the config file: edits in place, replacements, and Kubernetes ConfigMap updates.

A ConfigMap volume swaps a ``..data`` symlink in the file's dir rather than writing the file,
so the dir is watched (inotify, with a slow poll as a safety net) and the file's content is
compared: only a real change asks for a reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog
from asyncinotify import Inotify, Mask

log = structlog.get_logger(__name__)

POLL_INTERVAL = 5.0
SETTLE = 0.05
_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE | Mask.ATTRIB


def _content(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


async def watch_config_file(path: Path, on_change: Callable[[], None]) -> None:
    """Call ``on_change`` each time the content of ``path`` changes; runs until cancelled."""
    last = _content(path)
    while True:
        try:
            with Inotify() as inotify:
                inotify.add_watch(path.parent, _MASK)
                while True:
                    try:
                        async with asyncio.timeout(POLL_INTERVAL):
                            await inotify.get()
                        await asyncio.sleep(SETTLE)  # a ConfigMap swap is several events
                    except TimeoutError:
                        pass
                    current = _content(path)
                    if current is not None and current != last:
                        last = current
                        log.info("config file changed", path=str(path))
                        on_change()
        except OSError as exc:
            log.warning("cannot watch the config file's dir, polling", path=str(path), error=str(exc))
            await asyncio.sleep(POLL_INTERVAL)
            current = _content(path)
            if current is not None and current != last:
                last = current
                on_change()
