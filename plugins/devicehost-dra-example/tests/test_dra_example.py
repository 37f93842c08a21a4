"""The port, through the real host: what the reference's e2e suite checks, read from the CDI spec
the host writes for each claim (the container runtime injects exactly that), over real gRPC with
the in-memory API server. The same scenarios run on the real cluster in tests/e2e."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import devicehost
from devicehost.host.dra.drivers import DraDrivers
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint, unprepare
from devicehost.testing.host import running_host
from devicehost_dra_example import DRIVER, RESOURCE, DraExampleBackend, Settings
from devicehost_dra_example.config import GpuConfig
from devicehost_dra_example.net import DRIVER as NET_DRIVER
from devicehost_dra_example.net import DraExampleNetBackend, NetConfig
from devicehost_dra_example.node import seeded_uuids

TIME_SLICING = {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "GpuConfig"}


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dre-", dir="/tmp") as tmp:
        (Path(tmp) / "registry").mkdir()
        (Path(tmp) / "dp").mkdir()
        yield Path(tmp)


@asynccontextmanager
async def served(
    root: Path, cluster: ClusterStandIn, backend: DraExampleBackend, slices: int = 1, **settings: Any
) -> AsyncIterator[str]:
    """The host serving the port with no serve_through set: the backend's own default (dra) holds."""
    async with running_host(
        root / "dp",
        {"dra-example": backend},
        cluster=cluster,
        node_name="node-a",
        backends={"dra-example": {"node_name": "node-a", **settings}},
        dra_plugins_dir=root / "plugins",
        plugins_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        device_release=False,
    ):
        endpoint = await registered(root, DRIVER)
        await cluster.wait(lambda c: len(c.stored) == slices)
        yield endpoint


async def registered(root: Path, driver: str) -> str:
    """Register ``driver`` as the kubelet's plugin watcher does (its slices are published only
    after that); its DRA endpoint."""
    async with asyncio.timeout(5):
        while not (sockets := list((root / "registry").glob(f"devicehost-{driver}-*.sock"))):
            await asyncio.sleep(0.01)
    (socket,) = sockets
    return str((await registered_endpoint(socket)).endpoint)


def container_env(root: Path, cdi_ids: list[str]) -> dict[str, str]:
    """What a container given ``cdi_ids`` sees: the env edits of those devices in the claim's spec."""
    env: dict[str, str] = {}
    for spec_file in (root / "cdi").glob("*.json"):
        spec = json.loads(spec_file.read_text())
        for device in spec["devices"]:
            if f"{spec['kind']}={device['name']}" in cdi_ids:
                env |= dict(e.split("=", 1) for e in device["containerEdits"]["env"])
    return env


async def prepared_env(root: Path, where: str, ref: tuple[str, str, str]) -> dict[str, str]:
    answer = (await prepare(where, [ref])).claims[ref[1]]
    assert answer.error == ""
    return container_env(root, [i for d in answer.devices for i in d.cdi_device_ids])


def gpus(env: dict[str, str]) -> list[str]:
    return sorted(v for k, v in env.items() if k.startswith("GPU_DEVICE_") and v.startswith("gpu-"))


async def test_publishes_the_reference_gpus_through_dra_by_default(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend()):
        (body,) = cluster.stored.values()
    spec = body["spec"]
    assert spec["driver"] == DRIVER
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    first = spec["devices"][0]
    assert first["attributes"]["index"] == {"int": 0}
    assert first["attributes"]["model"] == {"string": "LATEST-GPU-MODEL"}
    assert first["attributes"]["driverVersion"] == {"version": "1.0.0"}
    assert first["attributes"]["uuid"] == {"string": seeded_uuids("node-a", "gpu", 8)[0]}
    assert first["capacity"] == {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}


async def test_one_distinct_gpu_per_claim_with_time_slicing_by_default(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend()) as where:
        envs = [await prepared_env(root, where, cluster.allocate(DRIVER, request="gpu")) for _ in range(2)]
    assert [len(gpus(e)) for e in envs] == [1, 1]
    assert gpus(envs[0]) != gpus(envs[1])
    for env in envs:
        (key,) = [k for k, v in env.items() if v.startswith("gpu-") and k.startswith("GPU_DEVICE_")]
        assert env[f"{key}_SHARING_STRATEGY"] == "TimeSlicing"
        assert env[f"{key}_TIMESLICE_INTERVAL"] == "Default"
        assert env["DRA_ADMIN_ACCESS"] == "false"
        assert env["DRA_RESOURCE_DRIVER_NAME"] == DRIVER


async def test_claim_config_selects_space_partitioning(root: Path) -> None:
    cluster = ClusterStandIn()
    config = TIME_SLICING | {
        "sharing": {"strategy": "SpacePartitioning", "spacePartitioningConfig": {"partitionCount": 10}}
    }
    async with served(root, cluster, DraExampleBackend()) as where:
        env = await prepared_env(root, where, cluster.allocate(DRIVER, request="sp-gpu", config=config))
    (gpu,) = gpus(env)
    key = f"GPU_DEVICE_{gpu.removeprefix('gpu-')}"
    assert (env[f"{key}_SHARING_STRATEGY"], env[f"{key}_PARTITION_COUNT"]) == ("SpacePartitioning", "10")


async def test_a_refused_config_fails_the_claim_naming_the_key_and_allocates_nothing(root: Path) -> None:
    cluster = ClusterStandIn()
    config = TIME_SLICING | {
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Often"}}
    }
    async with served(root, cluster, DraExampleBackend()) as where:
        ref = cluster.allocate(DRIVER, request="ts-gpu", config=config)
        error = (await prepare(where, [ref])).claims[ref[1]].error
        assert "request 'ts-gpu'" in error
        assert "parameters.sharing.timeSlicingConfig.interval" in error
        assert not list((root / "cdi").glob("*claim*"))
        good = cluster.allocate(DRIVER, request="gpu")
        assert (await prepare(where, [good])).claims[good[1]].error == ""  # the next claim is served


async def test_admin_access_is_in_the_env_and_shares_a_held_gpu(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend()) as where:
        normal = cluster.allocate(DRIVER, request="gpu", devices=["gpu-0"])
        admin = cluster.allocate(DRIVER, request="gpu", devices=["gpu-0"], admin_access=True)
        assert gpus(await prepared_env(root, where, normal)) == ["gpu-0"]
        env = await prepared_env(root, where, admin)
        assert (gpus(env), env["DRA_ADMIN_ACCESS"]) == (["gpu-0"], "true")
        assert (await unprepare(where, [admin])).claims[admin[1]].error == ""


async def test_a_subrequest_chosen_from_a_prioritized_list_is_prepared(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend()) as where:
        ref = cluster.allocate(DRIVER, request="gpu/older-gpu")
        answer = (await prepare(where, [ref])).claims[ref[1]]
        assert answer.error == ""
        assert [list(d.request_names) for d in answer.devices] == [["gpu/older-gpu"]]
        assert answer.devices[0].cdi_device_ids == [f"{DRIVER}/claim-{ref[1]}=gpu_older-gpu.gpu"]


def test_config_model_refuses_what_the_reference_refuses() -> None:
    GpuConfig.model_validate(TIME_SLICING)
    for bad in (
        {"sharing": {"strategy": "Fastest"}},
        {"sharing": {"strategy": "TimeSlicing", "spacePartitioningConfig": {"partitionCount": 2}}},
        {"sharing": {"strategy": "SpacePartitioning", "spacePartitioningConfig": {"partitionCount": -1}}},
        {"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Often"}}},
        {"extra": 1},
    ):
        with pytest.raises(ValidationError):
            GpuConfig.model_validate(TIME_SLICING | bad)


def test_through_the_device_plugin_api_it_answers_without_a_claim() -> None:
    backend = DraExampleBackend()
    backend.devicehost_configure(Settings(num_gpus=2, node_name="n"))
    env: dict[str, Any] = dict(backend.devicehost_allocate(RESOURCE, ("gpu-1",), None).envs)
    assert env["GPU_DEVICE_1"] == "gpu-1"
    assert "DRA_ADMIN_ACCESS" not in env
    with pytest.raises(ValueError, match="gpu-2"):
        backend.devicehost_allocate(RESOURCE, ("gpu-2",), None)


def test_an_operators_serve_through_wins_over_the_backends_default() -> None:
    from devicehost.host.config import HostConfig
    from devicehost.host.context import HostContext

    (resource,) = DraExampleBackend().devicehost_discover()
    drivers = DraDrivers(HostContext(HostConfig(serve_through={"dra-example": "both"}, node_name="n")), "t")
    assert drivers.api("dra-example", resource) == "both"
    plain = DraDrivers(HostContext(HostConfig()), "t")
    assert plain.api("dra-example", resource) == "dra"


def test_the_node_is_the_one_the_host_tells_unless_a_setting_names_one(tmp_path: Path) -> None:
    backend = DraExampleBackend()
    backend.devicehost_configure(Settings(num_gpus=1))
    backend.devicehost_host_facts(devicehost.HostFacts(node_name="told", cdi_dir=tmp_path))
    seeded = backend.devicehost_discover()[0].devices[0].attributes["uuid"]
    answer = backend.devicehost_allocate(RESOURCE, ("gpu-0",), None)
    assert answer.envs["KUBERNETES_NODE_NAME"] == "told"
    backend.devicehost_configure(Settings(num_gpus=1, node_name="set"))
    assert backend.devicehost_allocate(RESOURCE, ("gpu-0",), None).envs["KUBERNETES_NODE_NAME"] == "set"
    assert backend.devicehost_discover()[0].devices[0].attributes["uuid"] != seeded


async def test_partitions_draw_on_their_gpus_shared_counters(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend(), slices=2, num_gpus=2, gpu_partitions=4) as where:
        specs = {name: body["spec"] for name, body in cluster.stored.items()}
        ref = cluster.allocate(
            DRIVER, 2, request="gpu-partition", devices=["gpu-1-partition-0", "gpu-1-partition-3"]
        )
        env = await prepared_env(root, where, ref)
    counters = specs["node-a-gpu.example.com-gpu-counters"]
    devices = specs["node-a-gpu.example.com-gpu"]
    assert counters["pool"] == devices["pool"]
    assert counters["pool"]["resourceSliceCount"] == 2
    assert "devices" not in counters
    assert counters["sharedCounters"][0] == {
        "name": "gpu-0-counters",
        "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
    }
    by_name = {d["name"]: d for d in devices["devices"]}
    assert len(by_name) == 10  # 4 partitions and the full GPU, per GPU
    assert by_name["gpu-0-partition-1"]["consumesCounters"] == [
        {
            "counterSet": "gpu-0-counters",
            "counters": {"memory": {"value": "20Gi"}, "compute": {"value": "25"}},
        }
    ]
    assert by_name["gpu-0-partition-1"]["capacity"]["memory"] == {"value": "20Gi"}
    assert by_name["gpu-1-full"]["attributes"]["full"] == {"bool": True}
    assert by_name["gpu-1-full"]["consumesCounters"][0]["counters"]["memory"] == {"value": "80Gi"}
    assert env["GPU_DEVICE_1_PARTITION_0"] == "gpu-1-partition-0"
    assert env["GPU_DEVICE_1_PARTITION_3"] == "gpu-1-partition-3"
    assert env["GPU_DEVICE_1_PARTITION_3_SHARING_STRATEGY"] == "TimeSlicing"


def test_a_device_consuming_an_undeclared_counter_set_is_refused_at_discovery() -> None:
    from devicehost import Device, Resource
    from devicehost.hookspecs import rules

    resource = Resource(RESOURCE, (Device("p", consumes={"gpu-9-counters": {"memory": "1Gi"}}),))
    assert "consumes counter set 'gpu-9-counters', which the resource does not declare" in (
        rules.discovery_problem([resource]) or ""
    )


async def test_gpus_allowing_multiple_allocations_give_each_claim_its_share(root: Path) -> None:
    """The reference's gpu-allow-multiple-allocations: two claims of 16Gi and 20 compute on gpu-0."""
    cluster = ClusterStandIn()
    backend = DraExampleBackend()
    async with served(root, cluster, backend, num_gpus=1, gpu_allow_multiple_allocations=True) as where:
        (body,) = cluster.stored.values()
        asked = {"memory": "16Gi", "compute": "20"}
        refs = [cluster.allocate(DRIVER, request="gpu", devices=["gpu-0"], consumed=asked) for _ in range(2)]
        envs = [await prepared_env(root, where, ref) for ref in refs]
    (gpu,) = body["spec"]["devices"]
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["memory"] == {
        "value": "80Gi",
        "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}},
    }
    for env in envs:
        assert (env["GPU_DEVICE_0"], env["GPU_DEVICE_0_MEMORY"], env["GPU_DEVICE_0_COMPUTE"]) == (
            "gpu-0",
            "16Gi",
            "20",
        )
    assert envs[0]["GPU_DEVICE_0_SHARE_ID"] != envs[1]["GPU_DEVICE_0_SHARE_ID"]


# -- the net profile: NICs shared by bandwidth (net-consumable-capacity) ------------------------

NET_CONFIG = {"apiVersion": "net.resource.example.com/v1alpha1", "kind": "NetConfig"}


async def test_two_claims_share_one_nic_each_with_its_bandwidth(root: Path) -> None:
    cluster = ClusterStandIn()
    async with running_host(
        root / "dp",
        {"dra-example-net": DraExampleNetBackend()},
        cluster=cluster,
        node_name="node-a",
        backends={"dra-example-net": {"node_name": "node-a"}},
        dra_plugins_dir=root / "plugins",
        plugins_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        device_release=False,
    ):
        where = await registered(root, NET_DRIVER)
        await cluster.wait(lambda c: len(c.stored) == 1)
        (body,) = cluster.stored.values()
        fast = cluster.allocate(
            NET_DRIVER, request="nic", consumed={"ingressBandwidth": "10G", "egressBandwidth": "5G"},
            config=NET_CONFIG | {"bwBurst": {"ingressBurst": 800}},
        )  # fmt: skip
        slow = cluster.allocate(
            NET_DRIVER, request="nic", consumed={"ingressBandwidth": "5G", "egressBandwidth": "5G"}
        )
        envs = [await prepared_env(root, where, ref) for ref in (fast, slow)]
        assert (await unprepare(where, [fast])).claims[fast[1]].error == ""
    (nic,) = body["spec"]["devices"]
    assert nic["name"] == "nic-0"
    assert nic["allowMultipleAllocations"] is True
    assert nic["capacity"]["vfs"] == {"value": "100", "requestPolicy": {"default": "1", "validValues": ["1"]}}
    assert nic["capacity"]["ingressBandwidth"]["requestPolicy"]["validRange"] == {
        "min": "100M", "max": "100G", "step": "1M"
    }  # fmt: skip
    assert [
        (e["NET_DEVICE_0"], e["NET_DEVICE_0_INGRESS_RATE"], e["NET_DEVICE_0_EGRESS_RATE"]) for e in envs
    ] == [
        ("nic-0", "10000000000", "5000000000"),
        ("nic-0", "5000000000", "5000000000"),
    ]
    assert envs[0]["NET_DEVICE_0_INGRESS_BURST"] == "800"
    assert "NET_DEVICE_0_INGRESS_BURST" not in envs[1]
    assert envs[0]["NET_DEVICE_0_SHARE_ID"] != envs[1]["NET_DEVICE_0_SHARE_ID"]
    assert envs[0]["DRA_RESOURCE_DRIVER_NAME"] == NET_DRIVER


def test_a_burst_of_4gb_or_more_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"bwBurst\.ingressBurst"):
        NetConfig.model_validate(NET_CONFIG | {"bwBurst": {"ingressBurst": 8 * 2**32}})


async def test_binding_conditions_hold_a_claim_until_the_ready_file_exists(root: Path) -> None:
    """The reference's binding-conditions scenario: the GPU is published with its condition names,
    its claim waits (BindingConditions False) until the ready file exists, then is bindable; once
    prepared, the claim's status carries the GPU's uuid, model and driver version."""
    cluster, ready = ClusterStandIn(), root / "gpu-ready"
    settings = {
        "num_gpus": 1,
        "binding_conditions": True,
        "binding_ready_file": str(ready),
        "device_status": True,
    }
    async with served(root, cluster, DraExampleBackend(), **settings) as where:
        (body,) = cluster.stored.values()
        (device,) = body["spec"]["devices"]
        assert device["bindingConditions"] == ["BindingConditions"]
        assert device["bindingFailureConditions"] == ["BindingFailureConditions"]
        ref = cluster.allocate(DRIVER, request="gpu")
        await cluster.wait(lambda c: bool(c.device_statuses(ref[0], ref[2])))
        (waiting,) = cluster.device_statuses(ref[0], ref[2])[0]["conditions"]
        assert (waiting["type"], waiting["status"], waiting["reason"]) == (
            "BindingConditions",
            "False",
            "Attaching",
        )
        assert not cluster.bindable(ref[0], ref[2])
        ready.touch()
        await cluster.wait(lambda c: c.bindable(ref[0], ref[2]))
        env = await prepared_env(root, where, ref)
        (status,) = cluster.device_statuses(ref[0], ref[2])
    assert gpus(env) == ["gpu-0"]
    (condition,) = status["conditions"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True",
        "Ready",
        "Device is ready",
    )
    assert status["data"] == {
        "uuid": seeded_uuids("node-a", "gpu", 1)[0],
        "model": "LATEST-GPU-MODEL",
        "driverVersion": "1.0.0",
    }


async def test_without_the_settings_nothing_is_written_into_claims(root: Path) -> None:
    cluster = ClusterStandIn()
    async with served(root, cluster, DraExampleBackend(), num_gpus=1) as where:
        (device,) = next(iter(cluster.stored.values()))["spec"]["devices"]
        assert "bindingConditions" not in device
        ref = cluster.allocate(DRIVER, request="gpu")
        assert cluster.bindable(ref[0], ref[2])
        await prepared_env(root, where, ref)
        assert cluster.device_statuses(ref[0], ref[2]) == []
