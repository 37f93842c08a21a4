"""for_mode: which registration one host start uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from servingfakes import FakeRegisterClient, FakeSocketWatch

from devicehost.host.serving.kubelet_registrar import KubeletRegistration
from devicehost.host.serving.mode import DEPRECATION_FILE, for_mode
from devicehost.host.serving.watcher_registrar import PluginWatcherRegistration

KUBELET = "kubelet"
WATCHER = "watcher"


@pytest.mark.parametrize(
    ("mode", "deprecation_file", "registry_dir", "expected"),
    [
        ("kubelet", False, False, KUBELET),
        ("kubelet", True, True, KUBELET),
        ("watcher", False, False, WATCHER),
        ("watcher", True, True, WATCHER),
        ("auto", True, True, WATCHER),
        ("auto", True, False, KUBELET),
        ("auto", False, True, KUBELET),
        ("auto", False, False, KUBELET),
    ],
)
def test_for_mode(
    tmp_path: Path, mode: str, deprecation_file: bool, registry_dir: bool, expected: str
) -> None:
    device_plugins = tmp_path / "device-plugins"
    device_plugins.mkdir()
    registry = tmp_path / "plugins_registry"
    if deprecation_file:
        (device_plugins / DEPRECATION_FILE).write_text("")
    if registry_dir:
        registry.mkdir()
    watch = FakeSocketWatch(device_plugins)
    client = FakeRegisterClient()

    registration = for_mode(mode, device_plugins, registry, watch, client)  # type: ignore[arg-type]

    if expected == WATCHER:
        assert isinstance(registration, PluginWatcherRegistration)
        assert registration.directory == registry
    else:
        assert isinstance(registration, KubeletRegistration)
        assert registration.directory == device_plugins
        assert registration.client is client
    assert registration.watch is watch


def test_auto_needs_plugins_registry_to_be_a_dir(tmp_path: Path) -> None:
    device_plugins = tmp_path / "device-plugins"
    device_plugins.mkdir()
    (device_plugins / DEPRECATION_FILE).write_text("")
    registry = tmp_path / "plugins_registry"
    registry.write_text("not a dir")

    registration = for_mode(
        "auto", device_plugins, registry, FakeSocketWatch(device_plugins), FakeRegisterClient()
    )

    assert isinstance(registration, KubeletRegistration)


def test_the_deprecation_file_is_the_kubelets_name_for_it() -> None:
    assert DEPRECATION_FILE == "DEPRECATION"
