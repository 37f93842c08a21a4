"""``kubelet.sock`` as the host sees it: which file is there now, and when that changes.

:class:`KubeletSocketWatch` follows the device-plugins dir with inotify (and a slow poll as a
safety net for a dir that is deleted and recreated) and tells subscribers when ``kubelet.sock``
is a different file (a new inode, or a new ctime) or a file in the dir changes, naming the file
so that each subscriber looks only at what concerns it (with 100 resources, a kubelet restart
changes 100 sockets, and each one stat'ing its own socket per event was 10,000 stats). Each new
``kubelet.sock`` file is one *generation*: the unit a kubelet restart is counted in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog
from asyncinotify import Inotify, Mask

from devicehost.host.sockets import KUBELET_SOCKET

log = structlog.get_logger(__name__)

POLL_INTERVAL = 2.0
_WATCH_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime in ns) of ``path`` itself, or None when nothing is there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class KubeletSocketWatch:
    """Follows ``kubelet.sock`` and the files of the device-plugins dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.kubelet_socket = directory / KUBELET_SOCKET
        self._identity: tuple[int, int, int] | None = None
        self._inode: int | None = None
        self._generation = 0
        self._present = asyncio.Event()
        self._subscribers: set[Callable[[str | None], None]] = set()
        self._check()

    @property
    def inode(self) -> int | None:
        """The inode of ``kubelet.sock`` as last seen (None while it is absent)."""
        return self._inode

    @property
    def generation(self) -> int:
        """Bumped whenever the watch sees a different ``kubelet.sock`` file.

        A file is told by (device, inode, ctime), not by its inode number alone: the filesystem
        can hand a freed inode number straight to the next kubelet.sock. One file is counted
        once, so a late inotify event for a file already seen bumps nothing.
        """
        return self._generation

    @property
    def identity(self) -> tuple[int, int, int] | None:
        """(device, inode, ctime in ns) of the ``kubelet.sock`` of this generation."""
        return self._identity

    def subscribe(self, callback: Callable[[str | None], None]) -> None:
        """Call ``callback`` (on the loop) after a change in the dir, with the name of the file
        that changed, or None when anything may have (the periodic look, a new watch)."""
        self._subscribers.add(callback)

    def unsubscribe(self, callback: Callable[[str | None], None]) -> None:
        self._subscribers.discard(callback)

    async def wait_present(self) -> int:
        """Wait until ``kubelet.sock`` exists; return its inode."""
        while self.inode is None:
            await self._present.wait()
        return self.inode

    def refresh(self, changed: str | None = None) -> None:
        """Look at ``kubelet.sock`` again and tell every subscriber that ``changed`` did (None: anything)."""
        if changed in (None, KUBELET_SOCKET):
            self._check()
        for callback in list(self._subscribers):
            callback(changed)

    def _check(self) -> None:
        identity = file_identity(self.kubelet_socket)
        if identity == self._identity:
            return
        self._identity = identity
        self._inode = None if identity is None else identity[1]
        self._generation += 1
        log.info("kubelet socket changed", present=identity is not None, inode=self._inode)
        if identity is None:
            self._present.clear()
        else:
            self._present.set()

    async def run(self) -> None:
        """Watch until cancelled."""
        while True:
            try:
                with Inotify() as inotify:
                    inotify.add_watch(self.directory, _WATCH_MASK)
                    self.refresh()
                    await self._follow(inotify)
            except OSError as exc:
                log.warning(
                    "cannot watch the device-plugins dir, polling", dir=str(self.directory), error=str(exc)
                )
                self.refresh()
                await asyncio.sleep(POLL_INTERVAL)
            except Exception:  # every resource depends on this task: never let it die
                log.exception("the kubelet socket watch failed; watching again")
                await asyncio.sleep(POLL_INTERVAL)

    async def _follow(self, inotify: Inotify) -> None:
        """Tell each event's file, and look at everything every POLL_INTERVAL (however busy the
        dir: subscribers with files elsewhere rely on that look); return if the dir goes."""
        loop = asyncio.get_running_loop()
        looked = loop.time()
        while True:
            try:
                # not wait_for: 3.11's can swallow a cancel
                async with asyncio.timeout_at(looked + POLL_INTERVAL):
                    event = await inotify.get()
            except TimeoutError:
                self.refresh()
                looked = loop.time()
                continue
            gone = bool(event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED))
            self.refresh(None if gone or event.name is None else event.name.name)
            if gone:
                log.warning(
                    "device-plugins dir was removed; waiting for it to come back", dir=str(self.directory)
                )
                return
