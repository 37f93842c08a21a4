"""The in-memory API server stand-in over HTTP, for a ``devicehost run`` child process.

A host process reaches the API server through its kubeconfig and lightkube, as on a node; this
serves :class:`~devicehost.standin.apiserver.ApiServerStandIn` at ``http://127.0.0.1:<port>``
with the paths and JSON of the real one for the calls the host makes (its Node, ResourceClaims
and their status, ResourceSlices and their watch), so the claims and slices outlive the host
process: kill it, start it again, and the API server still has what it had.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from devicehost.resourceapi import SLICE_API_VERSION, ClaimAllocation, ClusterError, Conflict, NotFound
from devicehost.standin.apiserver import NODE_UID, ApiServerStandIn

RESOURCE = "/apis/resource.k8s.io/v1"


def status(error: ClusterError) -> web.Response:
    """A ClusterError as the API server's Status body and code."""
    text = str(error)
    code = (
        404 if isinstance(error, NotFound) else 409 if isinstance(error, Conflict) or "409" in text else 500
    )
    reason = {404: "NotFound", 409: "Conflict"}.get(code, "InternalError")
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": text,
        "reason": reason,
        "code": code,
    }
    # exactly application/json (no charset): only then does lightkube read it as the API's error
    return web.Response(
        body=json.dumps(body).encode(), status=code, headers={"Content-Type": "application/json"}
    )


def fields(request: web.Request) -> dict[str, str]:
    """The request's ``fieldSelector`` as a mapping."""
    selector = urllib.parse.unquote(request.query.get("fieldSelector", ""))
    return dict(part.partition("=")[::2] for part in selector.split(",") if part)


class ApiHttp:
    """The routes; each answers from ``api`` (which tests change directly)."""

    def __init__(self, api: ApiServerStandIn) -> None:
        self.api = api
        self.read_delay = 0.0
        """Seconds each read of a ResourceClaim takes (a slow API server)."""
        self.kubeconfig = Path()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self.node)
        app.router.add_get(RESOURCE + "/namespaces/{ns}/resourceclaims/{name}", self.claim)
        app.router.add_put(RESOURCE + "/namespaces/{ns}/resourceclaims/{name}/status", self.claim_status)
        app.router.add_get(RESOURCE + "/resourceclaims", self.claims)
        app.router.add_get(RESOURCE + "/resourceslices", self.slices)
        app.router.add_post(RESOURCE + "/resourceslices", self.create)
        app.router.add_put(RESOURCE + "/resourceslices/{name}", self.replace)
        app.router.add_delete(RESOURCE + "/resourceslices/{name}", self.delete)
        app.router.add_get("/apis/resource.k8s.io/{version}/{plural}", self.not_served)
        return app

    async def not_served(self, request: web.Request) -> web.Response:
        """Any other version or kind of resource.k8s.io: not served (what the host probes for)."""
        return status(NotFound(f"the server could not find the requested resource ({request.path})"))

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return web.json_response(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": NODE_UID}}
        )

    async def claim(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.read_delay)
        return self._claim_body(request.match_info["ns"], request.match_info["name"])

    def _claim_body(self, namespace: str, name: str) -> web.Response:
        if (namespace, name) not in self.api.claims:
            return status(NotFound(f"ResourceClaim {namespace}/{name}: 404 NotFound"))
        return web.json_response(self.api.claim_body(namespace, name))

    async def claim_status(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            await self.api.replace_claim_status(body)
        except ClusterError as exc:
            return status(exc)
        return self._claim_body(body["metadata"]["namespace"], body["metadata"]["name"])

    async def claims(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, claim_bodies(self.api.claim_events()))

    async def slices(self, request: web.Request) -> web.StreamResponse:
        wanted = fields(request)
        node, driver = wanted.get("spec.nodeName", ""), wanted.get("spec.driver", "")
        if request.query.get("watch") in ("true", "1"):
            return await self._stream(request, self.api.slice_events(node, driver))
        found = [
            body
            for body in self.api.stored.values()
            if (not node or body["spec"]["nodeName"] == node)
            and (not driver or body["spec"]["driver"] == driver)
        ]
        return web.json_response(
            {"apiVersion": SLICE_API_VERSION, "kind": "ResourceSliceList", "metadata": {}, "items": found}
        )

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.query.get("dryRun"):
            if not self.api.device_taints_kept:
                devices = [
                    {k: v for k, v in d.items() if k != "taints"} for d in body["spec"].get("devices", ())
                ]
                body = {**body, "spec": {**body["spec"], "devices": devices}}
            return web.json_response(body, status=201)
        try:
            await self.api.create_slice(body)
        except ClusterError as exc:
            return status(exc)
        return web.json_response(self.api.stored[body["metadata"]["name"]], status=201)

    async def replace(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            await self.api.replace_slice(body)
        except ClusterError as exc:
            return status(exc)
        return web.json_response(self.api.stored[body["metadata"]["name"]])

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.api.stored:
            return status(NotFound(f"resourceslices {name} not found"))
        await self.api.delete_slice(name)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    async def _stream(
        self, request: web.Request, events: AsyncGenerator[tuple[str, Mapping[str, Any]]]
    ) -> web.StreamResponse:
        """A watch: one JSON line per event until the client goes (or the server stops)."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request)
            async for kind, body in events:
                await response.write(json.dumps({"type": kind, "object": body}).encode() + b"\n")
        except ConnectionError:
            pass  # the host went (killed, say)
        return response


async def claim_bodies(
    events: AsyncGenerator[tuple[str, ClaimAllocation]],
) -> AsyncGenerator[tuple[str, Mapping[str, Any]]]:
    """The claims' watch events with each claim as JSON."""
    async for kind, claim in events:
        yield kind, claim.body


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig naming ``server`` (no credentials checked)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@asynccontextmanager
async def serving(api: ApiServerStandIn, directory: Path) -> AsyncIterator[ApiHttp]:
    """Serve ``api`` over HTTP until the block ends; its ``kubeconfig`` reaches it."""
    front = ApiHttp(api)
    runner = web.AppRunner(front.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        front.kubeconfig = kubeconfig(directory / "kubeconfig", f"http://127.0.0.1:{port}")
        yield front
    finally:
        await runner.cleanup()
