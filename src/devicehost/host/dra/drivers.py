"""Which API each resource is served through, and the DRA drivers of one host start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from devicehost.hookspecs.types import Api, Resource
from devicehost.host.dra import names
from devicehost.host.state import ClusterApi, DraState, ResourceState

if TYPE_CHECKING:
    from devicehost.host.context import HostContext
    from devicehost.host.dra.cluster import Cluster
    from devicehost.host.dra.driver import DraDriver, DraSetup
    from devicehost.host.serving.resource import ResourceServer


def kube_cluster(context: HostContext) -> Cluster:
    """The API server client (lightkube is imported only here, only when DRA is on)."""
    from devicehost.host.dra.kube import KubeCluster

    return KubeCluster(context.config.kubeconfig)


def served_through(operator: Mapping[str, Api], backend: str, resource: Resource) -> Api:
    """The API a resource is served through, the one rule the host and the webhook share: the
    operator's ``serve_through`` of the resource, else of its backend, else what the backend
    declared on the resource, else ``device-plugin``."""
    return operator.get(resource.name) or operator.get(backend) or resource.serve_through or "device-plugin"


class DraDrivers:
    """The drivers of one host start, each started as its first resource is attached.

    With no resource served through DRA it stays empty: no socket, no API server client, and
    the DRA modules (their protos, servicers and client) are never imported.
    """

    def __init__(
        self,
        context: HostContext,
        token: str,
        *,
        cluster: Callable[[], Cluster] | None = None,
    ) -> None:
        self._context = context
        self._token = token
        self._make_cluster = cluster or (lambda: kube_cluster(context))
        self._cluster: Cluster | None = None
        self.drivers: dict[str, DraDriver] = {}
        self._by_resource: dict[str, tuple[DraDriver, Api]] = {}
        self._starting = asyncio.Lock()
        self._served: asyncio.Task[ClusterApi | None] | None = None
        """The API server's DRA surface, probed once as the first driver starts."""

    def api(self, backend: str, resource: Resource) -> Api:
        """The API ``resource`` of ``backend`` is served through (:func:`served_through`)."""
        return served_through(self._context.config.serve_through, backend, resource)

    async def attach(self, server: ResourceServer, api: Api) -> None:
        """Serve ``server``'s resource through DRA too; a driver that cannot start is logged, and
        the resource keeps what else it is served through."""
        if not self._context.node_name:
            server.log.error(
                "not served through DRA: node_name is unset (ResourceSlices belong to a node); "
                "set it, --node-name, or DEVICEHOST_NODE_NAME",
                serve_through=api,
            )
            return
        name = names.driver_name(server.name, self._context.config.dra_drivers)
        async with self._starting:  # resources start together: one driver per name, started once
            driver = self.drivers.get(name)
            if driver is None:
                from devicehost.host.dra.driver import DraDriver

                driver = DraDriver(name, self._setup())
                try:
                    await driver.start(server)  # attached first: its claims restored before registration
                except Exception as exc:
                    server.log.error("not served through DRA", driver=name, error=str(exc))
                    return
                self.drivers[name] = driver
                if self._served is None:
                    self._served = asyncio.create_task(self._probe(name), name="probe the API server")
            else:
                await driver.attach(server)
        self._by_resource[server.name] = (driver, api)

    def detach(self, resource: str) -> None:
        """Stop publishing ``resource`` (its driver keeps serving: claims may still be unprepared)."""
        found = self._by_resource.pop(resource, None)
        if found is not None:
            found[0].detach(resource)

    def state(self, state: ResourceState) -> ResourceState:
        """``state`` with how its resource is served through DRA; registered as both APIs are."""
        found = self._by_resource.get(state.name)
        if found is None:
            return state
        driver, api = found
        only = api == "dra"
        prepared = sum(state.name in c.by_resource() for c in driver.claims.checkpoint.claims.values())
        slice_name = driver.resources[state.name].slice
        claims = driver.claims
        served = self._served.result() if self._served is not None and self._served.done() else None
        calls = driver.stats.snapshot(driver.publisher.written.writes, driver.publisher.publish_seconds)
        dra = DraState(
            driver.name,
            only,
            driver.registered,
            slice_name,
            prepared,
            driver.publisher.written.restored[state.name],
            served,
            calls,
            restored_claims=sum(uid in claims.checkpoint.claims for uid in claims.restored),
            not_restored=tuple(f"{uid}: {why}" for uid, why in claims.not_restored.items()),
            checkpoint_set_aside=tuple(claims.checkpoint.set_aside),
        )
        return replace(state, dra=dra, registered=driver.registered and (only or state.registered))

    async def follow_cdi_dir(self) -> None:
        """After a reload: every driver's prepared claims' CDI specs moved to the new ``cdi_dir``."""
        for driver in list(self.drivers.values()):
            await driver.claims.follow_cdi_dir()

    async def _probe(self, driver: str) -> ClusterApi | None:
        from devicehost.host.dra.features import probe

        assert self._cluster is not None  # made by the first driver's setup
        return await probe(self._cluster, self._context.config.node_name, driver)

    async def close(self) -> None:
        """Stop every driver (their slices deleted) and let go of the API server."""
        if self._served is not None:
            self._served.cancel()
            await asyncio.gather(self._served, return_exceptions=True)
        for driver in list(self.drivers.values()):
            try:
                await driver.stop()
            except Exception as exc:  # one driver's failure must not keep the others' sockets
                driver.log.error("DRA driver did not stop cleanly", error=str(exc))
        self.drivers.clear()
        if self._cluster is not None:
            await self._cluster.close()

    def _setup(self) -> DraSetup:
        from devicehost.host.dra.driver import DraSetup

        if self._cluster is None:
            self._cluster = self._make_cluster()
        return DraSetup(self._context, self._cluster, self._token)
