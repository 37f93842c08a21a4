"""Claims the host must refuse or undo, and devices it must not publish, through DRA."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from drafakes import dra_host, dra_root

import devicehost
from devicehost import ContainerAllocation, Device, Health, Resource
from devicehost.hookspecs import rules
from devicehost.host.daemon import Host
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint, unprepare

DRIVER = "example.org"


class TwoPools:
    """example.org/a and example.org/b; allocating b fails while ``fail_b``."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.fail_b = False
        self.health: dict[str, Health] = {}
        self.released: list[tuple[str, tuple[str, ...]]] = []
        self.release_takes = 0.0
        self.allocated: list[tuple[str, tuple[str, ...]]] = []

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [
            Resource(
                f"example.org/{r}",
                tuple(
                    Device(f"{r}{n}", self.health.get(f"{r}{n}", Health.HEALTHY)) for n in range(self.count)
                ),
            )
            for r in "ab"
        ]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        if resource.endswith("/b") and self.fail_b:
            raise RuntimeError("b is broken")
        self.allocated.append((resource, device_ids))
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        time.sleep(self.release_takes)
        self.released.append((resource, device_ids))


@pytest.fixture
def root() -> Iterator[Path]:
    with dra_root("drc-") as made:
        yield made


def host_of(
    root: Path, backend: object, cluster: ClusterStandIn, **settings: Any
) -> AbstractAsyncContextManager[Host]:
    return dra_host(root, {"two": backend}, cluster, "n", rediscover_interval=0.05, **settings)


async def endpoint(root: Path, cluster: ClusterStandIn, slices: int = 2) -> str:
    await cluster.wait(lambda c: len(c.stored) == slices)
    (socket,) = (root / "registry").glob("devicehost-example.org-*.sock")
    return (await registered_endpoint(socket)).endpoint


def claim(cluster: ClusterStandIn, *devices: tuple[str, str, str]) -> tuple[str, str, str]:
    """A claim of (request, pool, device) devices of example.org, as the scheduler would write it."""
    uid = f"uid-{len(cluster.claims)}"
    allocated = tuple(AllocatedDevice(r, DRIVER, pool, d) for r, pool, d in devices)
    cluster.claims[("default", uid)] = ClaimAllocation(uid, allocated)
    return "default", uid, uid


async def test_a_claim_whose_second_allocation_fails_gives_back_the_first(root: Path) -> None:
    backend, cluster = TwoPools(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        where = await endpoint(root, cluster)
        backend.fail_b = True
        ref = claim(cluster, ("x", "n/a", "a0"), ("y", "n/b", "b0"))
        answer = (await prepare(where, [ref])).claims[ref[1]]
        assert "b is broken" in answer.error
        assert backend.released == [("example.org/a", ("a0",))]  # a0 was allocated, then given back
        assert not list((root / "cdi").glob("*"))


async def test_each_request_of_a_claim_carries_its_own_cdi_device(root: Path) -> None:
    backend, cluster = TwoPools(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        where = await endpoint(root, cluster)
        ref = claim(cluster, ("x", "n/a", "a0"), ("y", "n/a", "a1"))
        answer = (await prepare(where, [ref])).claims[ref[1]]
        kind = f"{DRIVER}/claim-{ref[1]}"
        assert [(list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices] == [
            (["x"], [f"{kind}=x.a"]),
            (["y"], [f"{kind}=y.a"]),
        ]
        assert backend.allocated == [("example.org/a", ("a0",)), ("example.org/a", ("a1",))]
        assert (await unprepare(where, [ref])).claims[ref[1]].error == ""
        assert backend.released == [("example.org/a", ("a0", "a1"))]


async def test_a_claim_unprepared_while_asked_to_prepare_is_prepared_again(root: Path) -> None:
    backend, cluster = TwoPools(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        where = await endpoint(root, cluster)
        ref = claim(cluster, ("x", "n/a", "a0"))
        assert (await prepare(where, [ref])).claims[ref[1]].error == ""
        backend.release_takes = 0.3
        unprepared = asyncio.create_task(unprepare(where, [ref]))
        await asyncio.sleep(0.1)  # the unprepare holds the claims now; the prepare finds it prepared
        again = (await prepare(where, [ref])).claims[ref[1]]
        assert (await unprepared).claims[ref[1]].error == ""
        assert again.error == ""  # read again once the unprepare was through, and prepared anew
        assert backend.allocated == [("example.org/a", ("a0",)), ("example.org/a", ("a0",))]


async def test_an_unhealthy_device_is_not_prepared_until_it_recovers(root: Path) -> None:
    backend, cluster = TwoPools(), ClusterStandIn()
    async with host_of(root, backend, cluster):
        where = await endpoint(root, cluster)
        backend.health["a1"] = Health.UNHEALTHY
        await cluster.wait(lambda c: len(c.stored["n-example.org-a"]["spec"]["devices"]) == 1)
        ref = claim(cluster, ("x", "n/a", "a1"))  # allocated before it turned unhealthy
        assert "is unhealthy" in (await prepare(where, [ref])).claims[ref[1]].error
        backend.health.clear()
        await cluster.wait(lambda c: len(c.stored["n-example.org-a"]["spec"]["devices"]) == 2)
        assert (await prepare(where, [ref])).claims[ref[1]].error == ""  # the kubelet asks again


async def test_more_devices_than_a_slice_holds_are_published_over_two_slices(root: Path) -> None:
    """Issue 25: they were not published at all (one slice per resource, 128 devices at most)."""
    backend, cluster = TwoPools(count=129), ClusterStandIn()
    async with host_of(root, backend, cluster):
        await cluster.wait(lambda c: len(c.stored) == 4)
        assert {
            name: (len(body["spec"]["devices"]), body["spec"]["pool"]["resourceSliceCount"])
            for name, body in cluster.stored.items()
        } == {
            "n-example.org-a": (128, 2),
            "n-example.org-a-1": (1, 2),
            "n-example.org-b": (128, 2),
            "n-example.org-b-1": (1, 2),
        }


def test_backend_attributes_may_not_reuse_the_hosts_names() -> None:
    assert "host's own" in (rules.device_problem(Device("d", attributes={"id": "x"})) or "")
    assert rules.device_problem(Device("d", attributes={"model": "x"})) is None
