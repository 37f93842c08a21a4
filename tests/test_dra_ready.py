"""Readiness of a resource served through DRA only: not ready while the first discovery's
resource is starting, nor before the kubelet registered its driver; ready once it did."""

from __future__ import annotations

from drafakes import dra_host, dra_root
from hostfakes import ScriptedBackend, widgets
from waiting import eventually

from devicehost.testing.cluster import ClusterStandIn, registered_endpoint

FIRST_ROUND = "host: the first discovery is not done (its resources are not all served yet)"


async def test_a_dra_resource_is_ready_once_started_and_its_driver_registered() -> None:
    backend = ScriptedBackend(widgets("example.com/widget", 2))
    backend.hanging = {"devicehost_start"}  # the resource's start takes its time
    with dra_root("dh-ready-") as root:
        async with dra_host(root, {"ex": backend}, ClusterStandIn(), "node-a") as host:
            await eventually(lambda: backend.count("devicehost_start") == 1, "the start hook called")
            assert host.snapshot().problems == (FIRST_ROUND,)
            backend.hang.set()
            await eventually(lambda: host.discoveries >= 1, "the first round done")
            assert host.snapshot().problems == (
                "resource example.com/widget (backend ex): not registered and streaming",
            )
            (socket,) = (root / "registry").glob("devicehost-example.com-*.sock")
            await registered_endpoint(socket)  # the kubelet's plugin watcher registers the driver
            await eventually(lambda: host.snapshot().ready, "ready")
            (state,) = host.snapshot().resources
            assert state.dra is not None
            assert (state.dra.only, state.dra.registered, state.registered) == (True, True, True)
