"""The real API server client says what failed in one line, never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from devicehost.host.dra.cluster import ClusterError
from devicehost.host.dra.kube import KubeCluster
from devicehost.resourceapi import ServedApi


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


def _json(body: object, status: int = 200) -> web.Response:
    """JSON as the API server sends it (lightkube reads a Status only with exactly this type)."""
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )


class ApiServer136:
    """An HTTP API server as 1.36 serves DRA by default: ``resource.k8s.io/v1`` only, with device
    taints kept and the other gated fields dropped."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(f"{request.method} {request.path}")
        if not request.path.startswith("/apis/resource.k8s.io/v1/resourceslices"):
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                      "message": "the server could not find the requested resource"}  # fmt: skip
            return _json(status, status=404)
        if request.method == "GET":
            return _json({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                                      "metadata": {}, "items": []})  # fmt: skip
        assert request.query.get("dryRun") == "All"  # nothing stored
        body = await request.json()
        device = body["spec"]["devices"][0]
        body["spec"]["devices"][0] = {k: v for k, v in device.items() if k in ("name", "taints")}
        return _json(body, status=201)


async def test_what_the_api_server_serves_is_found_by_discovery_and_dry_runs(tmp_path: Path) -> None:
    server = ApiServer136()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    cluster = KubeCluster(kubeconfig(tmp_path / "config", f"http://127.0.0.1:{port}"))
    try:
        served = await cluster.served_api("n", "example.com")
    finally:
        await cluster.close()
        await runner.cleanup()
    assert served == ServedApi(("v1",), "", ("taints",))
    assert served.features == {
        "device taints in slices": True,
        "binding conditions": False,
        "consumable capacity": False,
        "DeviceTaintRule": False,
    }
    assert sum(p.startswith("POST") for p in server.paths) == 3  # one dry run per feature, once
