"""The binding watch alone (``host/dra/binding.py``): a claim allocated a device with binding
conditions is followed, its status written from the backend's answers until they hold, and it
is let go; a claim deleted meanwhile is let go too. The API server is the in-memory stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog
from drafakes import attached, fake_server
from waiting import eventually

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, DeviceCondition, DeviceStatus
from devicehost.host.dra.binding import BindingWatch
from devicehost.host.dra.claimwatch import ClaimWatch
from devicehost.standin.apiserver import ApiServerStandIn

DRIVER = "example.org"
NIC = "example.org/nic"
POOL = "n/nic"


class AttachingNic:
    """A NIC that is attached at the backend's second answer."""

    def __init__(self) -> None:
        self.asked = 0

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return []

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation()

    @devicehost.hookimpl
    def devicehost_device_status(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
    ) -> Mapping[str, DeviceStatus]:
        self.asked += 1
        ready = self.asked >= 2
        condition = DeviceCondition(status=ready, reason="Attached" if ready else "Attaching")
        return {d: DeviceStatus(conditions={"Attached": condition}) for d in device_ids}


async def publish(api: ApiServerStandIn, *names: str) -> None:
    devices = [{"name": n, "bindingConditions": ["Attached"]} for n in names]
    spec = {"nodeName": "n", "driver": DRIVER, "pool": {"name": POOL, "generation": 1}, "devices": devices}
    await api.create_slice({"metadata": {"name": "nic-slice"}, "spec": spec})


async def changed(seen: int) -> int:
    return seen + 1


async def test_a_claim_awaiting_conditions_is_followed_until_they_hold() -> None:
    api = ApiServerStandIn()
    await publish(api, "n0", "n1")
    plugin = AttachingNic()
    with fake_server(plugin, [Device("n0", binding_conditions=("Attached",)), Device("n1")], NIC) as server:
        watch = BindingWatch(DRIVER, api, {NIC: attached(server, POOL)}, structlog.get_logger())
        claims = ClaimWatch(api, {"binding conditions": watch}, changed, structlog.get_logger())
        assert watch.wanted()
        namespace, _, name = api.allocate(DRIVER, devices=["n0"])
        claims.start()
        await eventually(lambda: api.bindable(namespace, name), "the condition written True", within=10)
        await eventually(lambda: watch.settled == 1 and not watch.following, "the claim let go", within=10)
        (status,) = api.device_statuses(namespace, name)
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("Attached", "True", "Attached")
        ]
        assert plugin.asked == 2
        await claims.stop()
        await watch.stop()


async def test_a_deleted_claim_is_let_go_and_no_watch_starts_without_binding_conditions() -> None:
    api = ApiServerStandIn()
    await publish(api, "n0")
    plugin = AttachingNic()
    plugin.asked = -100  # never attached
    with fake_server(plugin, [Device("n0", binding_conditions=("Attached",))], NIC) as server:
        watch = BindingWatch(DRIVER, api, {NIC: attached(server, POOL)}, structlog.get_logger())
        claims = ClaimWatch(api, {"binding conditions": watch}, changed, structlog.get_logger())
        namespace, _, name = api.allocate(DRIVER)
        with structlog.testing.capture_logs() as logs:
            claims.start()
            await eventually(lambda: (namespace, name) in watch.following, "the claim followed", within=10)
            del api.claims[(namespace, name)]
            await eventually(lambda: not watch.following, "the claim let go", within=10)
        assert watch.settled == 1  # followed until it awaited nothing more: it is gone
        said = [e["event"] for e in logs if "claim" in e]
        assert said == ["claim no longer awaits binding conditions"]  # no write failure said for it
        assert plugin.asked < 0  # never attached
        await claims.stop()
        await watch.stop()
    with fake_server(AttachingNic(), [Device("n0")], NIC) as plain:
        idle = BindingWatch(DRIVER, api, {NIC: attached(plain, POOL)}, structlog.get_logger())
        assert not idle.wanted()
        await asyncio.sleep(0)
