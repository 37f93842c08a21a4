"""Nothing is given out twice across the two APIs: a card and its four partitions, drawing on one
counter set, served through both, on the real host with the kubelet stand-in (device plugin side,
pod-resources) and the API server stand-in (DRA).

The port (``dra-example`` with ``gpu_partitions: 4``) publishes ``gpu-0-full`` and
``gpu-0-partition-0..3``; the full device consumes the whole counter set, each partition a quarter.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from drafakes import dra_root
from waiting import eventually

from devicehost.host import release
from devicehost.host.daemon import Host
from devicehost.standin import DraCallError, KubeletStandIn
from devicehost.testing.cluster import ClusterStandIn
from devicehost.testing.host import beside_kubelet, running_host
from devicehost_dra_example import DRIVER, RESOURCE, DraExampleBackend

FULL = "gpu-0-full"
PARTS = [f"gpu-0-partition-{n}" for n in range(4)]
SLICE_COUNTERS = "gpu-0-counters"


@dataclass
class Rig:
    host: Host
    kubelet: KubeletStandIn
    cluster: ClusterStandIn

    def published(self) -> set[str]:
        """The devices the slices offer the scheduler."""
        return {device for _, device in self.cluster.devices(DRIVER)}

    def counters(self) -> dict[str, str]:
        """The published counter set of the card."""
        for body in self.cluster.stored.values():
            for counter_set in body["spec"].get("sharedCounters", ()):
                if counter_set["name"] == SLICE_COUNTERS:
                    return {k: v["value"] for k, v in counter_set["counters"].items()}
        raise AssertionError("no counter set published")

    def unhealthy(self) -> set[str]:
        """The devices the kubelet sees Unhealthy."""
        return {d.id for d in self.kubelet.view(RESOURCE).devices if not d.healthy}

    async def prepare(self, *devices: str) -> tuple[tuple[str, str, str], str]:
        """A claim the scheduler allocated ``devices`` to, prepared by the kubelet; its error."""
        ref = self.cluster.allocate(DRIVER, len(devices), devices=devices)
        return ref, await self.prepare_claim(ref)

    async def prepare_claim(self, ref: tuple[str, str, str]) -> str:
        """The kubelet prepares the claim ``ref``: "" or the claim's error."""
        try:
            await self.kubelet.dra.prepare(DRIVER, [ref])
        except DraCallError as exc:
            return str(exc)
        return ""


@asynccontextmanager
async def both(**settings: Any) -> AsyncIterator[Rig]:
    """The port with one GPU in four partitions, served through both APIs."""
    with dra_root("xapi-") as root:
        dp = root / "dp"
        dp.mkdir()
        cluster = ClusterStandIn()
        async with (
            KubeletStandIn(dp, root / "registry", pod_resources_socket=beside_kubelet(dp)) as kubelet,
            running_host(
                dp,
                {"dra-example": DraExampleBackend()},
                cluster=cluster,
                serve_through={"dra-example": "both"},
                node_name="node-a",
                dra_plugins_dir=root / "plugins",
                plugins_registry_dir=root / "registry",
                cdi_dir=root / "cdi",
                pod_resources_interval=0.5,
                backends={"dra-example": {"num_gpus": 1, "gpu_partitions": 4, "node_name": "node-a"}},
                **settings,
            ) as host,
        ):
            await kubelet.wait_for_resource(RESOURCE, healthy=5)
            await kubelet.dra.wait_for_driver(DRIVER)
            rig = Rig(host, kubelet, cluster)
            await eventually(lambda: rig.published() == {FULL, *PARTS}, "the whole card published")
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
        await within_a_second(lambda: rig.unhealthy() == set(), "the card and partitions free again")
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[0]])  # given out now


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
        assert rig.counters() == {"memory": str(60 * 2**30), "compute": "75"}  # what the partition left
        with pytest.raises(AssertionError, match="only 0 free devices"):
            rig.cluster.allocate(DRIVER, devices=[FULL])  # the scheduler cannot choose it
        _, error = await rig.prepare(PARTS[0], PARTS[1], PARTS[3])
        assert error == ""  # the rest of the card is DRA's

        rig.kubelet.release_pod("p")
        await eventually(lambda: PARTS[2] in rig.published(), "the partition published again", within=5)


async def test_a_claim_the_scheduler_gave_the_card_before_the_device_plugin_took_a_partition_is_refused() -> (
    None
):
    async with both() as rig:
        ref = rig.cluster.allocate(DRIVER, devices=[FULL])  # allocated, not yet prepared
        await rig.kubelet.allocate(RESOURCE, device_ids=[PARTS[0]], pod="p")
        error = await rig.prepare_claim(ref)
        assert error.endswith(
            f"{RESOURCE}: 'gpu-0-full' would overdraw counter 'compute' of counter set "
            "'gpu-0-counters' with what both APIs hold (125 of 100)"
        ), error
        await eventually(
            lambda: rig.unhealthy() == {FULL}, "only the card masked: the refused claim holds nothing"
        )
        assert rig.host.resources[RESOURCE].table.inventory.held("dra") == frozenset()


async def test_an_allocation_the_kubelet_never_lists_holds_until_the_grace_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(release, "ALLOCATED_GRACE", 1.0)
    async with both() as rig:
        await rig.kubelet.allocate_ids(RESOURCE, [PARTS[3]])  # booked to no pod: never listed
        await within_a_second(lambda: rig.published() == set(PARTS[:3]), "held from its Allocate on")
        await eventually(lambda: rig.published() == {FULL, *PARTS}, "given back after the grace", within=5)
