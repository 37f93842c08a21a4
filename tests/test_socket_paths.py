"""Socket paths within the unix limit (107 bytes) for any valid name under the kubelet roots
that distributions use, with real sockets and the kubelet stand-in.

/var/lib/k0s and /var/snap/microk8s are not ours to write: each root is built under a temporary
dir with the same length in bytes, so every socket path below it has the length it would have
on such a node.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from waiting import eventually

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.daemon import Host
from devicehost.host.dra import names
from devicehost.host.sockets import MAX_UNIX_PATH, is_listening, new_token, parse_socket_name, socket_name
from devicehost.standin.kubelet import KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import running_host

ROOTS = {
    "upstream": "/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
}
DRIVER = "gpu-" + "a" * 47 + ".example.com"  # 63 characters: the longest valid driver name
assert len(DRIVER) == 63
DRA_RESOURCE = "example.com/gpu"
LONG_RESOURCE = f"{'v' * 63}.{'w' * 40}.example.com/{'x' * 63}"
"""A device plugin resource of a long valid name (a 116-character domain, a 63-character name)."""


class Both:
    """A DRA resource (served through ``DRIVER``) and a device plugin resource of a long name."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [
            Resource(DRA_RESOURCE, (Device("gpu0"),), serve_through="dra"),
            Resource(LONG_RESOURCE, (Device("x0"),)),
        ]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})


@pytest.fixture(params=sorted(ROOTS))
def root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A kubelet root of the same length in bytes as ``ROOTS[param]``, with its dirs made."""
    real = ROOTS[request.param]
    with tempfile.TemporaryDirectory(prefix="s", dir="/tmp") as tmp:
        padding = len(real) - len(tmp) - 1
        assert padding > 0, "the temporary dir is longer than the root it stands for"
        made = Path(tmp) / ("r" * padding)
        assert len(os.fsencode(made)) == len(real)
        for sub in ("device-plugins", "plugins", "plugins_registry"):
            (made / sub).mkdir(parents=True)
        yield made


def paths(root: Path, token: str) -> list[Path]:
    """Every socket path one host start makes under ``root`` for ``DRIVER`` and ``LONG_RESOURCE``."""
    dra_dir = names.driver_dir(root / "plugins", DRIVER)
    registry, device_plugins = root / "plugins_registry", root / "device-plugins"
    return [
        dra_dir / socket_name(names.DRA_SOCKET, token, dra_dir),
        registry / socket_name(DRIVER, token, registry),
        device_plugins / socket_name(LONG_RESOURCE, token, device_plugins),
    ]


def test_every_socket_path_fits_binds_and_is_the_same_but_for_the_token(root: Path) -> None:
    first, second = paths(root, new_token()), paths(root, new_token())
    for one, other in zip(first, second, strict=True):
        assert len(os.fsencode(one)) <= MAX_UNIX_PATH
        assert one.parent == other.parent  # the driver's dir is the same for every host start
        ours, theirs = parse_socket_name(one.name), parse_socket_name(other.name)
        assert ours is not None
        assert theirs is not None
        assert ours[0] == theirs[0]  # a rolling update's two hosts: one resource, two tokens
        assert ours[1] != theirs[1]
    for path in first:
        path.parent.mkdir(exist_ok=True)
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(os.fspath(path))  # the real limit: the kernel's
            listener.listen()
            assert is_listening(path)


@contextlib.asynccontextmanager
async def host_under(root: Path, cluster: ClusterStandIn) -> AsyncIterator[Host]:
    """The real host serving :class:`Both` under ``root``: DRA through ``DRIVER``, the long
    resource through the device plugin API."""
    async with running_host(
        root / "device-plugins",
        {"both": Both()},
        cluster=cluster,
        node_name="n",
        dra_drivers={DRA_RESOURCE: DRIVER},
        dra_plugins_dir=root / "plugins",
        plugins_registry_dir=root / "plugins_registry",
        pod_resources_socket=root / "pod-resources" / "kubelet.sock",
        cdi_dir=root / "cdi",
        device_release=False,
    ) as host:
        yield host


async def test_a_63_character_driver_and_a_long_resource_serve_under_the_root(root: Path) -> None:
    cluster = ClusterStandIn()
    async with KubeletStandIn(root / "device-plugins", root / "plugins_registry") as kubelet:
        async with host_under(root, cluster) as first:
            endpoint = await kubelet.dra.wait_for_driver(DRIVER)
            assert len(os.fsencode(endpoint)) <= MAX_UNIX_PATH
            await kubelet.wait_for_resource(LONG_RESOURCE, healthy=1)
            await cluster.wait(lambda c: bool(c.devices(DRIVER)))
            claim = cluster.allocate(DRIVER)
            prepared = await kubelet.dra.prepare(DRIVER, [claim])
            assert [d.device for d in prepared[claim[1]]] == ["gpu0"]
            async with host_under(root, cluster) as second:  # a second host, as in a rolling update
                await eventually(lambda: len(kubelet.dra.endpoints(DRIVER)) == 2, "both registered")
                await eventually(lambda: second.token in first.peers.hosts, "the first sees the second")
                theirs = socket_name(LONG_RESOURCE, second.token, root / "device-plugins")
                assert first.peers.hosts[second.token] == (theirs,)  # its long resource's cut name
            assert cluster.devices(DRIVER)  # the one that stopped saw the other: the slice stayed
            assert len(kubelet.dra.endpoints(DRIVER)) == 1
        assert not cluster.devices(DRIVER)
