"""Which registration one host start uses, chosen once: ``kubelet``, ``watcher``, or ``auto``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from devicehost.host.serving.kubelet_registrar import KubeletRegistration
from devicehost.host.serving.registration import RegisterClient, Registration, SocketWatch
from devicehost.host.serving.watcher_registrar import PluginWatcherRegistration

DEPRECATION_FILE = "DEPRECATION"
"""Written by kubelets that register device plugins through the plugin watcher."""


def for_mode(
    mode: Literal["auto", "kubelet", "watcher"],
    device_plugins_dir: Path,
    plugins_registry_dir: Path,
    watch: SocketWatch,
    client: RegisterClient,
) -> Registration:
    """``auto`` is ``watcher`` when the kubelet wrote ``DEPRECATION`` and plugins_registry exists."""
    if mode == "auto":
        deprecated = (device_plugins_dir / DEPRECATION_FILE).exists()
        mode = "watcher" if deprecated and plugins_registry_dir.is_dir() else "kubelet"
    if mode == "watcher":
        return PluginWatcherRegistration(plugins_registry_dir, watch)
    return KubeletRegistration(device_plugins_dir, watch, client)
