"""Live reload: ConfigMap-style file swaps and SIGHUP change only what the new config changes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import eventually

import devicehost
from devicehost import cdi
from devicehost.host.app import running
from devicehost.host.backends.loader import load_backends
from devicehost.host.config import HostConfig, build_config
from devicehost.host.daemon import Host
from devicehost.host.kubelet.client import KubeletClient
from devicehost.host.serving.kubelet_registrar import KubeletRegistration
from devicehost.testing import running_host
from devicehost.testing.cluster import ClusterStandIn, prepare, registered_endpoint, unprepare
from devicehost.testing.host import beside_kubelet
from devicehost.testing.kubelet import EventKind, KubeletStandIn

pytestmark = pytest.mark.timeout(60)


class ConfigMapDir:
    """A dir laid out like a Kubernetes ConfigMap volume: updates swap the ``..data`` symlink."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir()
        (root / "config.yaml").symlink_to("..data/config.yaml")

    @property
    def file(self) -> Path:
        return self.root / "config.yaml"

    def publish(self, config: dict[str, object]) -> None:
        self.version += 1
        data = self.root / f"..2026_{self.version}"
        data.mkdir()
        (data / "config.yaml").write_text(yaml.safe_dump(config))
        (self.root / "..data_tmp").symlink_to(data.name)
        os.rename(self.root / "..data_tmp", self.root / "..data")


def example_config(plugin_dir: Path, resources: dict[str, int], **extra: object) -> dict[str, object]:
    return {
        "device_plugins_dir": str(plugin_dir),
        "enabled_backends": ["example"],
        "backends": {"example": {"resources": resources}},
        **extra,
    }


@contextlib.asynccontextmanager
async def host_from_file(config_file: Path) -> AsyncIterator[Host]:
    """The real host, its backends loaded from entry points, reloading from ``config_file``."""

    def load() -> HostConfig:
        return build_config(config_file, {}, {})

    config = build_config(config_file, {}, {})
    statuses = load_backends(config.enabled_backends, config.disabled_backends, config.hook_timeout)
    backends = [s.backend for s in statuses if s.backend is not None]
    async with running(config, backends, reload_config=load, config_file=config_file) as host:
        yield host


async def test_configmap_update_adds_and_removes_and_leaves_the_rest_alone(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path
) -> None:
    configmap = ConfigMapDir(short_tmp / "cfg")
    configmap.publish(
        example_config(plugin_dir, {"example.com/a": 1, "example.com/b": 2, "example.com/c": 3})
    )
    async with host_from_file(configmap.file) as host:
        for name, count in (("example.com/a", 1), ("example.com/b", 2), ("example.com/c", 3)):
            await kubelet.wait_for_resource(name, healthy=count)
        kept = host.resources["example.com/c"]
        lists_before = len(kubelet.history("example.com/c"))
        since = len(kubelet.events)

        configmap.publish(
            example_config(plugin_dir, {"example.com/a": 1, "example.com/c": 3, "example.com/d": 4})
        )
        await kubelet.wait_for_resource("example.com/d", healthy=4)
        await kubelet.wait_for_event(EventKind.DISCONNECTED, "example.com/b", since=since)

        assert sorted(host.resources) == ["example.com/a", "example.com/c", "example.com/d"]
        assert host.resources["example.com/c"] is kept
        assert host.snapshot().resource("example.com/c").registration_count == 1
        assert kubelet.registrations("example.com/c") == 1
        assert kubelet.view("example.com/c").connected
        assert len(kubelet.history("example.com/c")) == lists_before
        assert not [e for e in kubelet.events[since:] if e.resource in ("example.com/a", "example.com/c")]


async def test_invalid_reload_changes_nothing(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path
) -> None:
    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump(example_config(plugin_dir, {"example.com/a": 2})))
    async with host_from_file(config_file) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        before = host.config
        discoveries = host.discoveries
        config_file.write_text(
            "rediscover_interval: never\nbackends: {example: {resources: {example.com/z: 1}}}\n"
        )
        host.request_reload()
        await eventually(lambda: host.discoveries > discoveries, "the discovery after the reload")
        assert host.config == before
        assert sorted(host.resources) == ["example.com/a"]
        assert kubelet.registrations("example.com/a") == 1


async def test_reload_enables_and_disables_backends(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path, fake_site: Path
) -> None:
    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump(example_config(plugin_dir, {"example.com/a": 2})))
    async with host_from_file(config_file) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        config_file.write_text(
            yaml.safe_dump(
                example_config(plugin_dir, {"example.com/a": 2}, enabled_backends=["example", "good"])
            )
        )
        await kubelet.wait_for_resource("good.example.com/thing", healthy=2)
        assert sorted(host.backends.loaded) == ["example", "good"]
        since = len(kubelet.events)
        config_file.write_text(
            yaml.safe_dump(
                example_config(
                    plugin_dir,
                    {"example.com/a": 2},
                    enabled_backends=["example", "good"],
                    disabled_backends=["example"],
                )
            )
        )
        await kubelet.wait_for_event(EventKind.DISCONNECTED, "example.com/a", since=since)
        assert sorted(host.backends.loaded) == ["good"]
        assert sorted(host.resources) == ["good.example.com/thing"]
        assert kubelet.registrations("good.example.com/thing") == 1


def defined_cdi_names(cdi_dir: Path) -> set[str]:
    """Every fully qualified CDI device name the specs on disk define."""
    names = set()
    for spec in cdi_dir.glob("*.json"):
        doc = json.loads(spec.read_text())
        names |= {f"{doc['kind']}={d['name']}" for d in doc["devices"]}
    return names


async def test_cdi_specs_follow_a_reload_so_every_allocated_name_is_defined(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path
) -> None:
    """2 -> 4 widgets with cdi: true, then cdi: false: each Allocate names only devices on disk."""
    cdi_dir = short_tmp / "cdi"
    config_file = short_tmp / "config.yaml"
    widget = "example.com/widget"

    def publish(count: int, use_cdi: bool) -> None:
        config = example_config(plugin_dir, {widget: count}, cdi_dir=str(cdi_dir))
        config["backends"] = {"example": {"resources": {widget: count}, "cdi": use_cdi}}
        config_file.write_text(yaml.safe_dump(config))

    async def allocated_names(device_id: str) -> list[str]:
        response = await kubelet.allocate_ids(widget, [device_id])
        kubelet.release(widget)
        return [d.name for d in response.container_responses[0].cdi_devices]

    publish(2, use_cdi=True)
    async with host_from_file(config_file) as host:
        await kubelet.wait_for_resource(widget, healthy=2)
        assert await allocated_names("widget-1") == [f"{widget}=widget-1"]
        assert defined_cdi_names(cdi_dir) == {f"{widget}=widget-0", f"{widget}=widget-1"}
        served = host.resources[widget]

        publish(4, use_cdi=True)
        host.request_reload()
        await kubelet.wait_for_resource(widget, healthy=4)
        assert host.resources[widget] is served, "updated in place, not restarted"
        names = await allocated_names("widget-3")
        assert names == [f"{widget}=widget-3"]
        assert set(names) <= defined_cdi_names(cdi_dir)
        assert len(defined_cdi_names(cdi_dir)) == 4

        publish(4, use_cdi=False)
        host.request_reload()
        await eventually(lambda: not list(cdi_dir.glob("*.json")), "the spec removed")
        assert await allocated_names("widget-3") == []
    assert not list(cdi_dir.glob("*.json"))


async def test_a_reload_of_cdi_dir_alone_moves_the_example_backends_spec(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path
) -> None:
    """The backend is told the new cdi_dir (devicehost_host_facts) though its settings stay."""
    config_file, widget = short_tmp / "config.yaml", "example.com/widget"

    def publish(cdi_dir: Path) -> None:
        config = example_config(plugin_dir, {widget: 2}, cdi_dir=str(cdi_dir))
        config["backends"] = {"example": {"resources": {widget: 2}, "cdi": True}}
        config_file.write_text(yaml.safe_dump(config))

    publish(short_tmp / "old")
    async with host_from_file(config_file) as host:
        await kubelet.wait_for_resource(widget, healthy=2)
        assert len(defined_cdi_names(short_tmp / "old")) == 2
        publish(short_tmp / "new")
        host.request_reload()
        await eventually(lambda: not list((short_tmp / "old").glob("*.json")), "the old spec removed")
        assert defined_cdi_names(short_tmp / "new") == {f"{widget}=widget-0", f"{widget}=widget-1"}


class Reporter:
    """One resource served through DRA and the device plugin API: records the host facts it is
    told, ``cdi.default_dir()`` inside its allocate hook, and each health poll."""

    def __init__(self) -> None:
        self.told: list[devicehost.HostFacts] = []
        self.default_dirs: list[Path] = []
        self.polls = 0

    @devicehost.hookimpl
    def devicehost_host_facts(self, facts: devicehost.HostFacts) -> None:
        self.told.append(facts)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [devicehost.Resource(WIDGET, tuple(devicehost.Device(f"w{i}") for i in range(4)))]

    @devicehost.hookimpl
    def devicehost_health(self) -> dict[str, devicehost.Health]:
        self.polls += 1
        return {}

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> devicehost.ContainerAllocation:
        self.default_dirs.append(cdi.default_dir())
        return devicehost.ContainerAllocation(envs={"WIDGETS": ",".join(device_ids)})


WIDGET = "example.com/widget"
IN_PLACE_VALUES: dict[str, object] = {
    "rediscover_interval": 0.2,
    "health_interval": 0.05,
    "hook_timeout": 3.5,
    "register_timeout": 2.5,
    "cdi_dir": "cdi-new",
}
"""A new value for every in-place setting but the backends' own three, which the tests above
reload (enable, disable, new settings); ``cdi_dir`` is under the test's dir."""


async def test_every_in_place_setting_reaches_the_part_that_uses_it(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path, cdi_in_tmp: Path
) -> None:
    from devicehost.host.config import IN_PLACE, on_reload

    in_place = {key for key in HostConfig.model_fields if on_reload(key) == IN_PLACE}
    assert in_place == set(IN_PLACE_VALUES) | {"enabled_backends", "disabled_backends", "backends"}
    (short_tmp / "registry").mkdir()
    old_dir, new_dir = short_tmp / "cdi-old", short_tmp / "cdi-new"
    settings: dict[str, Any] = {
        "enabled_backends": ("example",),  # an installed backend's name: the reload keeps it loaded
        "serve_through": {"example": "both"},
        "node_name": "n",
        "dra_plugins_dir": short_tmp / "plugins",
        "plugins_registry_dir": short_tmp / "registry",
        "cdi_dir": old_dir,
        "health_interval": 30.0,
    }
    reloaded = {**settings, **IN_PLACE_VALUES, "cdi_dir": new_dir, "device_plugins_dir": plugin_dir}
    reloaded["pod_resources_socket"] = beside_kubelet(plugin_dir)
    reporter, cluster = Reporter(), ClusterStandIn()
    async with running_host(
        plugin_dir,
        {"example": reporter},
        reload_config=lambda: HostConfig(**reloaded),
        cluster=cluster,
        **settings,
    ) as host:
        await kubelet.wait_for_resource(WIDGET, healthy=4)
        (socket,) = (short_tmp / "registry").glob("devicehost-example.com-*.sock")
        endpoint = (await registered_endpoint(socket)).endpoint
        before = cluster.allocate("example.com", 1, name="before")
        assert not (await prepare(endpoint, [before])).claims[before[1]].error
        assert claim_spec(old_dir, before).exists()
        host.request_reload()
        await eventually(lambda: host.config.rediscover_interval == 0.2, "the reload")
        # cdi_dir: the DRA side writes, moves and removes its claims' specs in the new dir ...
        after = cluster.allocate("example.com", 1, name="after")
        assert not (await prepare(endpoint, [after])).claims[after[1]].error
        assert claim_spec(new_dir, after).exists()
        assert claim_spec(new_dir, before).exists()
        assert not claim_spec(old_dir, before).exists()
        assert not (await unprepare(endpoint, [before, after])).claims[before[1]].error
        assert not list(new_dir.glob("*claim*"))
        assert not list(old_dir.glob("*claim*"))
        # ... and the backend is told it (and its hooks' default dir is it)
        assert reporter.told[-1] == devicehost.HostFacts(node_name="n", cdi_dir=new_dir)
        assert [f.cdi_dir for f in reporter.told] == [old_dir, new_dir]
        assert reporter.default_dirs == [old_dir, new_dir]
        # health_interval: the resource's health poll, at once (not after the 30 s it was sleeping)
        polls = reporter.polls
        await eventually(lambda: reporter.polls >= polls + 10, "health polls every 0.05 s", within=3)
        # hook_timeout: each hook call's bound; register_timeout: the Register client's
        (backend,) = host.backends
        assert backend.link.hook_timeout == 3.5
        registration = host.serving.registration
        assert isinstance(registration, KubeletRegistration)
        assert isinstance(registration.client, KubeletClient)
        assert registration.client.timeout == 2.5
        # rediscover_interval: the discovery loop
        discoveries = host.discoveries
        await eventually(lambda: host.discoveries >= discoveries + 3, "discoveries every 0.2 s", within=3)
        assert kubelet.registrations(WIDGET) == 1  # all applied in place: nothing served anew
    assert cdi.default_dir() == cdi_in_tmp  # the host's cdi_dir went to its hook calls only


def claim_spec(cdi_dir: Path, claim: tuple[str, str, str]) -> Path:
    return cdi.spec_path(f"example.com/claim-{claim[1]}", cdi_dir)
