"""Live reload: ConfigMap-style file swaps and SIGHUP change only what the new config changes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from waiting import eventually

from devicehost.host.app import running
from devicehost.host.backends.loader import load_backends
from devicehost.host.config import HostConfig, build_config
from devicehost.host.daemon import Host
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


IN_PLACE_VALUES: dict[str, object] = {
    "rediscover_interval": 0.2,
    "health_interval": 0.7,
    "hook_timeout": 3.5,
    "register_timeout": 2.5,
    "cdi_dir": "/tmp/dh-reloaded-cdi",
}
"""A new value for every in-place setting but the backends' own three, which the tests above
reload (enable, disable, new settings)."""


async def test_every_in_place_setting_reaches_the_running_host(
    kubelet: KubeletStandIn, plugin_dir: Path, short_tmp: Path, cdi_in_tmp: Path
) -> None:
    from devicehost.host.config import IN_PLACE, on_reload

    in_place = {key for key in HostConfig.model_fields if on_reload(key) == IN_PLACE}
    assert in_place == set(IN_PLACE_VALUES) | {"enabled_backends", "disabled_backends", "backends"}
    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump(example_config(plugin_dir, {"example.com/a": 2})))
    async with host_from_file(config_file) as host:
        await kubelet.wait_for_resource("example.com/a", healthy=2)
        config_file.write_text(
            yaml.safe_dump(example_config(plugin_dir, {"example.com/a": 2}, **IN_PLACE_VALUES))
        )
        host.request_reload()
        await eventually(lambda: host.config.rediscover_interval == 0.2, "the reload")
        for key, value in IN_PLACE_VALUES.items():
            assert str(getattr(host.config, key)) == str(value), key
        server = host.resources["example.com/a"]
        assert server.health_interval == 0.7
        (backend,) = host.backends
        assert backend.hook_timeout == 3.5
        assert backend.cdi_dir == Path("/tmp/dh-reloaded-cdi")
        discoveries = host.discoveries
        await eventually(lambda: host.discoveries >= discoveries + 3, "discoveries every 0.2 s", within=3)
        assert host.resources["example.com/a"] is server  # applied in place, not served anew
        assert kubelet.registrations("example.com/a") == 1
    from devicehost import cdi

    assert cdi.default_dir() == cdi_in_tmp  # the host's cdi_dir went to its hook calls only
