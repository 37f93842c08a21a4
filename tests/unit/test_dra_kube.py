"""The real API server client says what failed in one line, never with a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devicehost.host.dra.cluster import ClusterError
from devicehost.host.dra.kube import KubeCluster


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def test_no_credentials_is_an_error_of_the_call(tmp_path: Path) -> None:
    cluster = KubeCluster(tmp_path / "missing")  # made without error: the host starts
    with pytest.raises(ClusterError, match="no API server credentials"):
        await cluster.node_uid("n")
    await cluster.close()


async def test_an_api_server_that_refuses_says_what_was_being_done(tmp_path: Path) -> None:
    cluster = KubeCluster(kubeconfig(tmp_path / "config", "http://127.0.0.1:1"))
    with pytest.raises(ClusterError, match=r"^listing ResourceSlices: ConnectError: ") as caught:
        await cluster.slices("n", "example.com")
    assert "\n" not in str(caught.value)
    with pytest.raises(ClusterError, match=r"^deleting ResourceSlice s: ConnectError"):
        await cluster.delete_slice("s")
    await cluster.close()
