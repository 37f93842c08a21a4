"""Which API a resource is served through, and the DRA drivers of one host start (``host/dra/drivers.py``)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from drafakes import CountingCluster, Recorder, fake_server
from hostfakes import captured_logs

from devicehost import Device, Resource
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext
from devicehost.host.dra.drivers import DraDrivers
from devicehost.host.state import ResourceState
from devicehost.standin.kubelet import KubeletStandIn


def state(name: str, registered: bool = True) -> ResourceState:
    return ResourceState(name, "b", "/dp/sock", registered, 1, {"Healthy": 1}, {}, 0, 0, {})


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="drv-", dir="/tmp") as tmp:  # short socket paths
        (Path(tmp) / "registry").mkdir()
        yield Path(tmp)


def drivers_of(config: HostConfig, cluster: CountingCluster, made: list[int] | None = None) -> DraDrivers:
    def make() -> CountingCluster:
        if made is not None:
            made.append(1)
        return cluster

    return DraDrivers(HostContext(config), "tok", cluster=make)


@pytest.mark.parametrize(
    ("serve_through", "declared", "expected"),
    [
        ({"example.com/widget": "both", "b": "dra"}, "device-plugin", "both"),  # the resource's entry
        ({"b": "dra"}, "both", "dra"),  # the backend's entry over what the backend declared
        ({"other": "dra", "example.com/other": "dra"}, "both", "both"),  # declared by the backend
        ({}, None, "device-plugin"),  # nothing said
        ({"b": "device-plugin"}, "dra", "device-plugin"),  # the operator may turn DRA off again
    ],
)
def test_the_api_a_resource_is_served_through(
    serve_through: dict[str, str], declared: str | None, expected: str
) -> None:
    drivers = drivers_of(HostConfig(node_name="n", serve_through=serve_through), CountingCluster())
    resource = Resource("example.com/widget", (Device("w0"),), serve_through=declared)  # type: ignore[arg-type]
    assert drivers.api("b", resource) == expected


async def test_without_a_node_name_nothing_is_served_through_dra(root: Path) -> None:
    made: list[int] = []
    with captured_logs() as logs, fake_server(Recorder(), [Device("w0")]) as server:
        drivers = drivers_of(HostConfig(plugins_registry_dir=root / "registry"), CountingCluster(), made)
        await drivers.attach(server, "dra")  # type: ignore[arg-type]
        await drivers.attach(server, "both")  # type: ignore[arg-type]
        errors = [e for e in logs if e["log_level"] == "error"]
        assert [e["event"].split(":")[0] for e in errors] == ["not served through DRA"] * 2  # one per attach
        assert "node_name is unset" in errors[0]["event"]
        assert errors[0]["resource"] == "example.com/widget"
        assert drivers.drivers == {}
        assert made == []  # no API server client made
        assert drivers.state(state("example.com/widget")) == state("example.com/widget")
        assert list((root / "registry").iterdir()) == []  # no registration socket
        await drivers.close()


async def test_a_driver_that_cannot_start_is_logged_and_not_kept(root: Path) -> None:
    config = HostConfig(
        node_name="n", plugins_registry_dir=root / "missing", dra_plugins_dir=root / "plugins"
    )
    with captured_logs() as logs, fake_server(Recorder(), [Device("w0")]) as server:
        drivers = drivers_of(config, CountingCluster())
        await drivers.attach(server, "dra")  # type: ignore[arg-type]
        failed = [e for e in logs if e["event"] == "not served through DRA"]
        assert len(failed) == 1
        assert "plugins_registry dir" in failed[0]["error"]
        assert failed[0]["driver"] == "example.com"
        assert drivers.drivers == {}
        assert drivers.state(state("example.com/widget")).dra is None
        await drivers.close()


async def test_resources_of_one_driver_share_it_and_its_slices_go_at_close(root: Path) -> None:
    cluster = CountingCluster()
    config = HostConfig(
        node_name="n",
        plugins_registry_dir=root / "registry",
        dra_plugins_dir=root / "plugins",
        dra_drivers={"example.com/gizmo": "gizmo.example.com"},
    )
    drivers = drivers_of(config, cluster)
    async with KubeletStandIn(root / "dp", root / "registry"):  # registers the drivers: they publish
        await resources_of_one_driver(drivers, cluster)


async def resources_of_one_driver(drivers: DraDrivers, cluster: CountingCluster) -> None:
    with (
        fake_server(Recorder(), [Device("w0")]) as widget,
        fake_server(Recorder(), [Device("w1")], resource="example.com/other") as other,
        fake_server(Recorder(), [Device("g0")], resource="example.com/gizmo") as gizmo,
    ):
        try:
            await asyncio.gather(
                drivers.attach(widget, "dra"),  # type: ignore[arg-type]
                drivers.attach(other, "both"),  # type: ignore[arg-type]
                drivers.attach(gizmo, "dra"),  # type: ignore[arg-type]
            )
            assert sorted(drivers.drivers) == ["example.com", "gizmo.example.com"]  # one per name
            await cluster.wait(lambda c: len(c.stored) == 3)
            assert sorted(cluster.stored) == [
                "n-example.com-other",
                "n-example.com-widget",
                "n-gizmo.example.com-gizmo",
            ]
            only = drivers.state(state("example.com/widget")).dra
            assert only is not None
            assert (only.driver, only.only, only.slice, only.prepared_claims) == (
                "example.com",
                True,
                "n-example.com-widget",
                0,
            )
            both = drivers.state(state("example.com/other")).dra
            assert both is not None
            assert both.only is False
            drivers.detach("example.com/other")
            await cluster.wait(lambda c: "n-example.com-other" not in c.stored)
            assert drivers.state(state("example.com/other")).dra is None
        finally:
            await drivers.close()
    assert cluster.stored == {}
    assert cluster.calls["delete_slice"] == 3  # each slice deleted once
    assert drivers.drivers == {}
