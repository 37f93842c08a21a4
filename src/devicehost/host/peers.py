"""Other hosts in our socket dir: noticed, said once by each host, and what they mean for us.

Two hosts on one device-plugins dir (a rolling update's overlap, or a mistake) each register
the same resources, and the kubelet keeps the latest registration of each. A host sees the other
by its sockets: ``devicehost-<resource>-<token>.sock`` with a token not its own, on which a
process listens (a killed host's socket is no host). Each host logs the other once when it
appears and once when it leaves, on every change of the dir (the socket watch) and every
discovery round.

A resource of ours whose twin socket (same resource, other host) was created after our latest
registration was registered again by that host, after us: the kubelet serves theirs, so ours is
*superseded*, not registered, whatever our own stream says (kubelet 1.32 leaves a replaced
stream open). When that socket goes away, the kubelet has disconnected the resource (1.32
disconnects it when the current stream ends): the resource registers again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from devicehost.host.serving.resource import ResourceServer
from devicehost.host.sockets import is_listening, parse_socket_name

log = structlog.get_logger(__name__)

RELOOK_AFTER = 0.5
"""Seconds before a second look at a socket that did not accept yet (bound, not yet listening)."""
GATHER = 0.05
"""Seconds the dir's changes are gathered into one look (a restart changes every socket at once)."""


@dataclass(frozen=True)
class PeerSocket:
    """Another host's socket in our dir."""

    name: str
    resource_part: str
    token: str
    created: float
    """Its creation (ctime), in seconds since the epoch."""


class PeerWatch:
    """Follows other hosts' sockets in ``directory``; marks our resources they superseded."""

    def __init__(self, directory: Path, token: str, servers: Callable[[], Iterable[ResourceServer]]) -> None:
        self.directory = directory
        self.token = token
        self._servers = servers
        self.hosts: dict[str, tuple[str, ...]] = {}
        """Other hosts serving here now: their token, and their sockets' names."""
        self._refused: set[str] = set()
        """Sockets that did not accept at a look: looked at once more, then not until they change."""
        self._listening: dict[str, int] = {}
        """Sockets seen accepting, by name: their inode (not asked again until the periodic look)."""
        self._relook: asyncio.TimerHandle | None = None

    def on_dir_change(self, changed: str | None) -> None:
        """A socket watch subscriber: look again, shortly, when another host's socket came or went."""
        parsed = parse_socket_name(changed) if changed is not None else None
        not_a_peer = changed is not None and (parsed is None or parsed[1] == self.token)
        if not_a_peer or (self._relook is not None and not self._relook.cancelled()):
            return  # not another host's socket, or a look is coming anyway
        self._relook = asyncio.get_running_loop().call_later(GATHER, self._look_again)

    def _look_again(self) -> None:
        self._relook = None
        self.look(recheck=False)

    def look(self, recheck: bool = True) -> None:
        """See who serves here now; say what changed; mark and unmark our superseded resources.

        :param recheck: ask every socket again whether it accepts (the periodic look, once per
            discovery round); otherwise sockets seen accepting before are taken as live.
        """
        if recheck:
            self._listening.clear()
        peers = self._scan()
        hosts: dict[str, list[str]] = {}
        for peer in peers:
            hosts.setdefault(peer.token, []).append(peer.name)
        for token, names in sorted(hosts.items()):
            if token not in self.hosts:
                log.warning(
                    "another host serves in this device-plugins dir; the kubelet keeps the latest "
                    "registration of each resource",
                    other_host=token,
                    this_host=self.token,
                    sockets=sorted(names),
                )
        for token in sorted(set(self.hosts) - set(hosts)):
            log.info("the other host left this device-plugins dir", other_host=token, this_host=self.token)
        self.hosts = {token: tuple(sorted(names)) for token, names in hosts.items()}
        by_part: dict[str, list[PeerSocket]] = {}
        for peer in peers:
            by_part.setdefault(peer.resource_part, []).append(peer)
        present = {peer.name for peer in peers}
        for server in self._servers():
            _judge(server, by_part, present)

    def close(self) -> None:
        if self._relook is not None:
            self._relook.cancel()

    def _scan(self) -> list[PeerSocket]:
        found = []
        refused = set()
        for path in self.directory.glob("devicehost-*.sock"):
            parsed = parse_socket_name(path.name)
            if parsed is None or parsed[1] == self.token:
                continue
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if self._listening.get(path.name) != st.st_ino:
                if not is_listening(path):
                    refused.add(path.name)
                    continue
                self._listening[path.name] = st.st_ino
            found.append(PeerSocket(path.name, parsed[0], parsed[1], st.st_ctime))
        if refused - self._refused:  # just bound, maybe not listening yet: once more, shortly
            if self._relook is not None:
                self._relook.cancel()
            self._relook = asyncio.get_running_loop().call_later(RELOOK_AFTER, self._look_again)
        self._refused = refused
        present = {peer.name for peer in found} | refused
        self._listening = {name: ino for name, ino in self._listening.items() if name in present}
        return found


def _judge(server: ResourceServer, by_part: dict[str, list[PeerSocket]], present: set[str]) -> None:
    """Mark ``server`` superseded by a twin socket newer than its registration, or clear it."""
    parsed = parse_socket_name(server.socket.name)
    registered_at = server.streams.epoch_started
    if parsed is None or registered_at is None or not server.device_plugin:
        return
    newer = sorted(
        (p for p in by_part.get(parsed[0], ()) if p.created > registered_at), key=lambda p: p.created
    )
    server.supersede(newer[-1].name if newer else "", present)
