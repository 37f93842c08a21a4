"""Nothing is given out twice across the two APIs: a card and its four partitions, drawing on one
counter set, served through both, on the real host with the kubelet stand-in (device plugin side,
pod-resources) and the API server stand-in (DRA).

The port (``dra-example`` with ``gpu_partitions: 4``) publishes ``gpu-0-full`` and
``gpu-0-partition-0..3``; the full device consumes the whole counter set, each partition a quarter.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from drafakes import dra_root
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from probing import free_port
from waiting import eventually

from devicehost import Health
from devicehost.host import release
from devicehost.host.daemon import Host
from devicehost.host.dra.allocated import HOLDER
from devicehost.host.inventory import DEVICE_PLUGIN, PODS, amounts, consumed, overdrawn
from devicehost.host.ops.status import document
from devicehost.standin import AdmissionError, DraCallError, KubeletStandIn
from devicehost.standin.allocator import CANNOT_ALLOCATE
from devicehost.testing.cluster import ClusterStandIn, Unschedulable
from devicehost.testing.host import beside_kubelet, running_host
from devicehost_dra_example import DRIVER, RESOURCE, DraExampleBackend
from devicehost_example import ExampleBackend

FULL = "gpu-0-full"
PARTS = [f"gpu-0-partition-{n}" for n in range(4)]
SLICE_COUNTERS = "gpu-0-counters"


@dataclass
class Rig:
    host: Host
    kubelet: KubeletStandIn
    cluster: ClusterStandIn
    resource: str = RESOURCE
    driver: str = DRIVER

    def published(self) -> set[str]:
        """The devices the slices offer the scheduler."""
        return {device for _, device in self.cluster.devices(self.driver)}

    def counters(self) -> dict[str, str]:
        """The published counter set of the card."""
        for body in self.cluster.stored.values():
            for counter_set in body["spec"].get("sharedCounters", ()):
                if counter_set["name"] == SLICE_COUNTERS:
                    return {k: v["value"] for k, v in counter_set["counters"].items()}
        raise AssertionError("no counter set published")

    def unhealthy(self) -> set[str]:
        """The devices the kubelet sees Unhealthy."""
        return {d.id for d in self.kubelet.view(self.resource).devices if not d.healthy}

    async def prepare(self, *devices: str) -> tuple[tuple[str, str, str], str]:
        """A claim the scheduler allocated ``devices`` to, prepared by the kubelet; its error."""
        ref = self.cluster.allocate(self.driver, len(devices), devices=devices)
        return ref, await self.prepare_claim(ref)

    async def prepare_claim(self, ref: tuple[str, str, str]) -> str:
        """The kubelet prepares the claim ``ref``: "" or the claim's error."""
        try:
            await self.kubelet.dra.prepare(self.driver, [ref])
        except DraCallError as exc:
            return str(exc)
        return ""

    def advertised_unhealthy(self) -> set[str]:
        """What the host advertises Unhealthy now."""
        table = self.host.resources[self.resource].table
        return {d.id for d in table.advertised() if d.health is Health.UNHEALTHY}

    def given_out(self, claims: Iterable[tuple[str, str, str]]) -> tuple[set[str], set[str]]:
        """What containers hold (the kubelet's pods) and what prepared ``claims`` hold."""
        pods = {
            i
            for containers in self.kubelet.pods.values()
            for by in containers.values()
            for i in by.get(self.resource, ())
        }
        claimed = {d.device for ns, _, name in claims for d in self.cluster.claims[(ns, name)].devices}
        return pods, claimed

    def check(self, claims: Iterable[tuple[str, str, str]]) -> None:
        """No device given out through both APIs, no counter overdrawn by what is given out."""
        pods, claimed = self.given_out(claims)
        assert not pods & claimed, f"given out through both APIs: {sorted(pods & claimed)}"
        table = self.host.resources[self.resource].table
        devices = {d.id: d for d in table.devices}
        used = consumed(devices[i] for i in pods | claimed)
        assert overdrawn(amounts(table.counter_sets), used) is None, used


PORT = ("dra-example", RESOURCE, DRIVER, {"num_gpus": 1, "gpu_partitions": 4, "node_name": "node-a"})
"""The port with one GPU in four partitions: backend, resource, driver, settings."""


@asynccontextmanager
async def both(served: tuple[str, str, str, dict[str, Any]] = PORT, **settings: Any) -> AsyncIterator[Rig]:
    """``served`` (the port with one GPU in four partitions), served through both APIs."""
    name, resource, driver, backend_settings = served
    plugin = {"dra-example": DraExampleBackend, "example": ExampleBackend}[name]()
    with dra_root("xapi-") as root:
        dp = root / "dp"
        dp.mkdir()
        cluster = ClusterStandIn()
        async with (
            KubeletStandIn(dp, root / "registry", pod_resources_socket=beside_kubelet(dp)) as kubelet,
            running_host(
                dp,
                {name: plugin},
                cluster=cluster,
                serve_through={name: "both"},
                node_name="node-a",
                dra_plugins_dir=root / "plugins",
                plugins_registry_dir=root / "registry",
                cdi_dir=root / "cdi",
                pod_resources_interval=0.5,
                backends={name: backend_settings},
                **settings,
            ) as host,
        ):
            view = await kubelet.wait_for_resource(resource)
            await kubelet.dra.wait_for_driver(driver)
            rig = Rig(host, kubelet, cluster, resource, driver)
            await eventually(lambda: len(rig.published()) == view.total, "every device published")
            yield rig


async def within_a_second(check: Callable[[], bool], what: str) -> float:
    """Wait for ``check``; how long it took (it must hold within a second and a half: the
    publisher writes a pool at most once a second)."""
    started = time.monotonic()
    await eventually(check, what, within=1.5)
    return time.monotonic() - started


async def test_a_card_dra_holds_leaves_no_partition_to_the_device_plugin_api() -> None:
    async with both() as rig:
        ref, error = await rig.prepare(FULL)
        assert error == ""
        await within_a_second(lambda: rig.unhealthy() == {FULL, *PARTS}, "the card and its partitions masked")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        details = str(refused.value.details())
        assert "\n" not in details
        assert details == (
            f"{RESOURCE}: 'gpu-0-partition-0' would overdraw counter 'compute' of counter set "
            "'gpu-0-counters' with what both APIs hold (125 of 100)"
        )

        await rig.kubelet.dra.unprepare(DRIVER, [ref])
        del rig.cluster.claims[(ref[0], ref[2])]  # its pod ended: the claim goes too
        await within_a_second(lambda: rig.unhealthy() == set(), "the card and partitions free again")
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])  # given out now


async def test_status_says_what_each_api_masks() -> None:
    port = free_port()
    async with both(metrics_address=f"127.0.0.1:{port}") as rig:
        _, error = await rig.prepare(PARTS[1])
        assert error == ""
        resource = document(rig.host.snapshot())["resources"][RESOURCE]
        assert resource["masked"] == {"device-plugin": [FULL, PARTS[1]]}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "devicehost", "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert f"    masked for device-plugin: {FULL}, {PARTS[1]}\n" in done.stdout
        assert "    hook timeouts: allocate 10 s, release 10 s, health 10 s\n" in done.stdout


async def test_a_partition_dra_holds_masks_the_card_and_leaves_the_others() -> None:
    async with both() as rig:
        _, error = await rig.prepare(PARTS[1])
        assert error == ""
        await within_a_second(
            lambda: rig.unhealthy() == {FULL, PARTS[1]}, "the card and the held partition masked"
        )
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.kubelet.allocate_ids(RESOURCE, [PARTS[1]])
        assert "'gpu-0-partition-1' is held through DRA" in str(refused.value.details())


async def test_a_partition_the_device_plugin_api_holds_takes_the_card_off_the_slices() -> None:
    async with both() as rig:
        await rig.kubelet.allocate(RESOURCE, device_ids=[PARTS[2]], pod="p")
        await within_a_second(lambda: rig.published() == {PARTS[0], PARTS[1], PARTS[3]}, "the card withdrawn")
        assert rig.counters() == {"memory": "60Gi", "compute": "75"}  # what the partition left
        with pytest.raises(Unschedulable, match=f"^{re.escape(CANNOT_ALLOCATE)}$") as refused:
            rig.cluster.allocate(DRIVER, devices=[FULL])  # the scheduler cannot choose it
        assert refused.value.why == "request req: 0 devices match"  # the card is not in the slices
        _, error = await rig.prepare(PARTS[0], PARTS[1], PARTS[3])
        assert error == ""  # the rest of the card is DRA's

        rig.kubelet.release_pod("p")
        await eventually(lambda: PARTS[2] in rig.published(), "the partition published again", within=5)


async def test_a_card_the_scheduler_allocated_to_a_claim_is_masked_before_the_claim_is_prepared() -> None:
    async with both() as rig:
        ref = rig.cluster.allocate(DRIVER, devices=[FULL])  # allocated; the kubelet has not prepared it
        await within_a_second(lambda: rig.unhealthy() == {FULL, *PARTS}, "the card and its partitions masked")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])
        assert refused.value.details() == (
            f"{RESOURCE}: 'gpu-0-partition-0' would overdraw counter 'compute' of counter set "
            "'gpu-0-counters' with what both APIs hold (125 of 100)"
        )
        assert await rig.prepare_claim(ref) == ""  # its own allocation does not stand in its way
        await rig.kubelet.dra.unprepare(DRIVER, [ref])
        assert rig.unhealthy() == {FULL, *PARTS}  # still allocated: the scheduler has not given it back
        del rig.cluster.claims[(ref[0], ref[2])]  # the claim deleted (its pod ended)
        await within_a_second(lambda: rig.unhealthy() == set(), "the card and its partitions free again")
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])  # given out now


async def test_a_claim_the_scheduler_gave_the_card_before_the_device_plugin_took_a_partition_is_refused() -> (
    None
):
    async with both() as rig:
        rig.cluster.down = "503 ServiceUnavailable"  # the host's claim watch breaks, sees nothing
        await asyncio.sleep(0.2)
        ref = rig.cluster.allocate(DRIVER, devices=[FULL])  # allocated, not seen by the host yet
        await rig.kubelet.allocate(RESOURCE, device_ids=[PARTS[0]], pod="p")
        rig.cluster.down = None
        error = await rig.prepare_claim(ref)
        assert error.endswith(
            f"{RESOURCE}: 'gpu-0-full' would overdraw counter 'compute' of counter set "
            "'gpu-0-counters' with what both APIs hold (125 of 100)"
        ), error
        inventory = rig.host.resources[RESOURCE].table.inventory
        assert inventory.of(HOLDER) == frozenset()  # none prepared
        await eventually(lambda: PARTS[0] in inventory.of(PODS), "pod-resources lists the container")
        rig.kubelet.release_pod("p")
        await eventually(lambda: not inventory.held(DEVICE_PLUGIN), "the container let go of the partition")
        assert await rig.prepare_claim(ref) == ""  # the kubelet's retry, once the container let go


async def test_the_kubelet_is_sent_nothing_new_when_its_own_allocation_changes_only_the_slices() -> None:
    async with both(SERVED["example"]) as rig:
        servicer = rig.host.resources[rig.resource].servicer
        sent = servicer.updates_sent
        await rig.kubelet.allocate(rig.resource, device_ids=["widget-0"], pod="p")
        await within_a_second(lambda: rig.published() == {"widget-1", "widget-2"}, "widget-0 withdrawn")
        assert servicer.updates_sent == sent


async def test_an_allocation_the_kubelet_never_lists_holds_until_the_grace_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(release, "ALLOCATED_GRACE", 3.0)  # longer than the first write of the slices may wait
    async with both() as rig:
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[3]])  # booked to no pod: never listed
        await within_a_second(lambda: rig.published() == set(PARTS[:3]), "held from its Allocate on")
        await eventually(lambda: rig.published() == {FULL, *PARTS}, "given back after the grace", within=8)


SERVED = {
    "port-partitionable": (
        "dra-example",
        RESOURCE,
        DRIVER,
        {"num_gpus": 2, "gpu_partitions": 2, "node_name": "n"},
    ),
    "port-shares": ("dra-example", RESOURCE, DRIVER, {"num_gpus": 2, "gpu_allow_multiple_allocations": True}),
    "example": ("example", "example.com/widget", "example.com", {"resources": {"example.com/widget": 3}}),
}
STEPS = st.lists(
    st.tuples(st.sampled_from(["pod", "pod ends", "claim", "claim ends"]), st.integers(0, 5)),
    min_size=4,
    max_size=12,
)


async def drive(rig: Rig, steps: list[tuple[str, int]]) -> None:
    """Pods and claims come and go as ``steps`` say, each through its API's stand-in; after each
    step nothing is given out twice; at the end everything is free again on both sides."""
    pods: list[str] = []
    claims: list[tuple[str, str, str]] = []
    for n, (action, k) in enumerate(steps):
        if action == "pod":
            with contextlib.suppress(grpc.aio.AioRpcError, AdmissionError):  # refused: the pod fails
                await rig.kubelet.allocate(rig.resource, 1 + k % 2, pod=f"pod-{n}")
                pods.append(f"pod-{n}")
        elif action == "pod ends" and pods:
            rig.kubelet.release_pod(pods.pop(k % len(pods)))
        elif action == "claim":
            try:
                ref = rig.cluster.allocate(rig.driver, 1 + k % 2)
            except Unschedulable:  # nothing free as the slices say: the claim waits
                continue
            if await rig.prepare_claim(ref):  # refused: the scheduler gives it back
                del rig.cluster.claims[(ref[0], ref[2])]
            else:
                claims.append(ref)
        elif action == "claim ends" and claims:
            ref = claims.pop(k % len(claims))
            await rig.kubelet.dra.unprepare(rig.driver, [ref])
            del rig.cluster.claims[(ref[0], ref[2])]
        rig.check(claims)
        await eventually(lambda: rig.unhealthy() == rig.advertised_unhealthy(), "the kubelet's view settled")
    event(f"{len(pods)} pods and {len(claims)} claims held at the end")
    for ref in claims:
        await rig.kubelet.dra.unprepare(rig.driver, [ref])
        del rig.cluster.claims[(ref[0], ref[2])]  # and deleted: the scheduler gives its devices back
    for pod in pods:
        rig.kubelet.release_pod(pod)
    total = len(rig.host.resources[rig.resource].table.devices)
    await eventually(
        lambda: not rig.unhealthy() and len(rig.published()) == total, "all free again", within=10
    )


@pytest.mark.parametrize("served", sorted(SERVED))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_random_pods_and_claims_through_both_apis_never_share_a_device(
    served: str, steps: list[tuple[str, int]]
) -> None:
    async def run() -> None:
        async with both(SERVED[served], rediscover_interval=3600.0) as rig:
            await drive(rig, steps)

    with pytest.MonkeyPatch.context() as patch:  # a pod ended before any look listed it: held as long
        patch.setattr(release, "ALLOCATED_GRACE", 1.0)
        asyncio.run(run())
