"""Live reload: ConfigMap-style file swaps and SIGHUP change only what the new config changes."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

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
        while host.discoveries == discoveries:
            await asyncio.sleep(0.01)
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
