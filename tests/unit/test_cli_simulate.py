"""``run --simulate-kubelet``: a stand-in kubelet in a temp dir in front of app.run_host, then cleanup."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from devicehost.host import simulate
from devicehost.host.backends.backend import Backend
from devicehost.host.config import HostConfig


class FakeRunHost:
    """Records what run_host saw while it ran: the config, the dir's contents, the reload."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: dict[str, Any] = {}

    async def __call__(
        self,
        config: HostConfig,
        backends: Sequence[Backend],
        *,
        failed_backends: Mapping[str, str] | None = None,
        reload_config: Callable[[], HostConfig] | None = None,
        config_file: Path | None = None,
        on_start: Callable[[Any], None] | None = None,
        cluster: Callable[[], Any] | None = None,
        metrics_listener: object = None,
    ) -> None:
        assert reload_config is not None
        assert cluster is not None  # DRA talks to the in-memory API server, never a real one
        assert on_start is not None  # the simulation follows the host, to name backends
        directory = config.device_plugins_dir
        self.seen = {
            "dir": directory,
            "files": sorted(p.name for p in directory.iterdir()),
            "pod_resources": config.pod_resources_socket,
            "pod_resources_served": config.pod_resources_socket.is_socket(),
            "reloaded": reload_config(),
            "failed_backends": failed_backends,
            "config_file": config_file,
        }
        if self.fail:
            raise RuntimeError("host failed")


async def test_the_host_serves_into_the_stand_in_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeRunHost()
    monkeypatch.setattr(simulate, "run_host", fake)
    config = HostConfig.model_validate({"health_interval": 3})
    reloaded_from_file = HostConfig.model_validate({"health_interval": 7, "device_plugins_dir": "/elsewhere"})
    await simulate.run_simulated(
        config,
        [],
        failed_backends={"x": "broken"},
        reload_config=lambda: reloaded_from_file,
        config_file=tmp_path / "c.yaml",
    )
    directory = fake.seen["dir"]
    assert directory.parent.name.startswith("devicehost-sim-")
    assert directory.name == "device-plugins"
    assert "kubelet.sock" in fake.seen["files"]  # the stand-in serves before the host starts
    # the stand-in's pod-resources socket, served beside its dir: never the machine's own kubelet's
    assert fake.seen["pod_resources"] == directory.parent / "pod-resources" / "kubelet.sock"
    assert fake.seen["pod_resources_served"]
    work = directory.parent  # every kubelet dir and the CDI dir of the simulation, none of the machine's
    assert fake.seen["reloaded"] == reloaded_from_file.model_copy(
        update={
            "device_plugins_dir": directory,
            "pod_resources_socket": fake.seen["pod_resources"],
            "plugins_registry_dir": work / "plugins_registry",
            "dra_plugins_dir": work / "plugins",
            "cdi_dir": work / "cdi",
            "node_name": simulate.NODE,
        }
    )
    assert fake.seen["failed_backends"] == {"x": "broken"}
    assert fake.seen["config_file"] == tmp_path / "c.yaml"
    assert not directory.parent.exists()  # the temp dir is gone
    assert asyncio.all_tasks() == {asyncio.current_task()}  # the reporting task too


async def test_without_a_reload_source_a_reload_keeps_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunHost()
    monkeypatch.setattr(simulate, "run_host", fake)
    await simulate.run_simulated(HostConfig.model_validate({"hook_timeout": 4}), [])
    assert fake.seen["reloaded"].hook_timeout == 4
    assert fake.seen["reloaded"].device_plugins_dir == fake.seen["dir"]


async def test_cleanup_when_the_host_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunHost(fail=True)
    monkeypatch.setattr(simulate, "run_host", fake)
    with pytest.raises(RuntimeError, match="host failed"):
        await simulate.run_simulated(HostConfig.model_validate({}), [])
    assert not fake.seen["dir"].parent.exists()
    assert asyncio.all_tasks() == {asyncio.current_task()}
