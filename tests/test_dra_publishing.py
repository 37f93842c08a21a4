"""When a driver's ResourceSlices are published, and what brings them back.

The real host with the kubelet stand-in (its plugin watcher registers the driver) and the API
server stand-in: no slice before the kubelet registered the driver, none left published while the
kubelet has no instance of it registered around a restart, and a slice deleted or changed by
someone else written back within 2 s, said once and counted in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drafakes import dra_host, dra_root
from hostfakes import captured_logs
from slicewatch import Timeline, Window, longest, missing, noted_kubelet, unregistered

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.daemon import Host
from devicehost.host.ops.metrics import HostMetrics
from devicehost.testing.cluster import ClusterStandIn

DRIVER = "example.org"
RESOURCE = "example.org/gpu"
SLICE = "n-example.org-gpu"
WRITE_BACK = 2.0
"""Seconds within which a slice deleted or changed by someone else is published again."""


class Gpus:
    """example.org/gpu with four devices."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource(RESOURCE, tuple(Device(f"gpu{n}") for n in range(4)))]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation(envs={"GPUS": ",".join(device_ids)})


@pytest.fixture
def root() -> Iterator[Path]:
    with dra_root("drp-") as made:
        yield made


def host(root: Path, cluster: ClusterStandIn) -> contextlib.AbstractAsyncContextManager[Host]:
    return dra_host(root, {"gpus": Gpus()}, cluster, "n", kubelet=False, rediscover_interval=0.05)


async def serving(root: Path, token: str) -> None:
    """Wait for the host's registration socket (it serves the driver)."""
    async with asyncio.timeout(5):
        while not (root / "registry" / f"devicehost-{DRIVER}-{token}.sock").exists():
            await asyncio.sleep(0.01)


async def test_slices_are_published_only_once_the_kubelet_registered_the_driver(root: Path) -> None:
    cluster = Timeline(DRIVER)
    async with host(root, cluster) as running:
        await serving(root, running.token)
        await asyncio.sleep(1.0)  # a slice used to be out 0.6 s after the start on a real node
        assert cluster.stored == {}  # no kubelet yet: nothing the scheduler could place
        async with noted_kubelet(root, cluster):
            await cluster.wait(lambda c: SLICE in c.stored)
    published = [registered for _, present, registered in cluster.changes if present]
    assert published
    assert all(published)  # each state with devices out: the driver registered


async def test_around_a_restart_no_slice_is_out_while_the_driver_is_unregistered(root: Path) -> None:
    cluster = Timeline(DRIVER)
    async with noted_kubelet(root, cluster) as kubelet:
        window = Window(cluster, kubelet, DRIVER)
        starts = []
        for _ in range(3):  # the host stops (its slices withdrawn) and starts again
            started = time.monotonic()
            async with host(root, cluster):
                await cluster.wait(lambda c: SLICE in c.stored)
                starts.append(time.monotonic() - started)
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.1)
        await window.stop()
    assert longest(window.samples, unregistered) == 0.0
    assert all(registered for _, present, registered in cluster.changes if present)
    seen = [published for _, published, _ in window.samples]
    assert sum(a and not b for a, b in itertools.pairwise(seen)) == 3  # it saw each stop
    gap = longest(window.samples, missing)
    print(f"restart: unpublished for up to {gap:.3f} s; start to published {max(starts):.3f} s at most")


async def test_a_slice_deleted_or_changed_by_someone_else_is_written_back(root: Path) -> None:
    cluster = Timeline(DRIVER)
    with captured_logs() as logs:
        async with noted_kubelet(root, cluster), host(root, cluster) as running:
            await cluster.wait(lambda c: SLICE in c.stored)
            original = cluster.stored[SLICE]["spec"]
            await asyncio.sleep(1.1)  # the first write's interval is over: a slice long published
            started = time.monotonic()
            await cluster.delete_slice(SLICE)  # as an operator or a garbage collector
            await cluster.wait(lambda c: SLICE in c.stored, timeout=WRITE_BACK)
            deleted_for = time.monotonic() - started
            changed = {**cluster.stored[SLICE], "spec": {**original, "devices": original["devices"][:1]}}
            started = time.monotonic()
            await cluster.replace_slice(changed)  # another client's edit, at the current resourceVersion
            await cluster.wait(lambda c: len(c.stored[SLICE]["spec"]["devices"]) == 4, timeout=WRITE_BACK)
            changed_for = time.monotonic() - started
            writes = cluster.changes[-1]
            await asyncio.sleep(1.2)  # its own writes seen by its watch: nothing more written
            assert cluster.changes[-1] == writes
            state = running.snapshot().resources[0].dra
            metrics = HostMetrics()
            metrics.watch(running.snapshot)
            text = metrics.render().decode()
    assert deleted_for < WRITE_BACK
    assert changed_for < WRITE_BACK
    assert state is not None
    assert state.slices_restored == 2
    assert f'devicehost_dra_slices_restored_total{{backend="gpus",resource="{RESOURCE}"}} 2.0' in text
    assert [e["slice"] for e in logs if e["event"].startswith("ResourceSlice deleted by someone else")] == [
        SLICE
    ]
    assert [e["slice"] for e in logs if e["event"].startswith("ResourceSlice changed by someone else")] == [
        SLICE
    ]
    print(f"written back after a delete in {deleted_for:.3f} s, after an edit in {changed_for:.3f} s")
