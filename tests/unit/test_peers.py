"""Other hosts in our socket dir (``host/peers.py``): a listening socket of another host's token
is a host; a socket nobody listens on (a killed host's) is none; our own sockets are not peers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devicehost.host.peers import PeerWatch
from devicehost.host.sockets import new_token, socket_name

WIDGET = "example.com/widget"


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    """Sockets the test makes listen; closed at the end."""
    made: list[socket.socket] = []
    yield made
    for sock in made:
        sock.close()


def bound(path: Path, made: list[socket.socket], *, listen: bool) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    if listen:
        sock.listen()
    made.append(sock)
    return path


async def test_a_listening_host_is_said_once_when_it_comes_and_once_when_it_goes(
    short_tmp: Path, listening: list[socket.socket]
) -> None:
    ours, theirs, dead = new_token(), new_token(), new_token()
    bound(short_tmp / socket_name(WIDGET, ours, short_tmp), listening, listen=True)
    other = bound(short_tmp / socket_name(WIDGET, theirs, short_tmp), listening, listen=True)
    bound(short_tmp / socket_name(WIDGET, dead, short_tmp), listening, listen=False)
    watch = PeerWatch(short_tmp, ours, list)
    with capture_logs() as logs:
        watch.look()
        watch.look()
        assert watch.hosts == {theirs: (other.name,)}
        listening[1].close()
        other.unlink()
        watch.look()
    watch.close()
    assert watch.hosts == {}
    said = [(e["event"], e["other_host"]) for e in logs if "other_host" in e]
    assert said == [
        (
            "another host serves in this device-plugins dir; the kubelet keeps the latest registration "
            "of each resource",
            theirs,
        ),
        ("the other host left this device-plugins dir", theirs),
    ]
