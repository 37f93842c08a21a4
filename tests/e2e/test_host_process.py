"""The host as a process on the node, against the real kubelet of the kit's cluster.

One host runs for the whole module, serving the example backend (``example.com/widget``) and the
gizmo fixture backend (``gizmos.example.org/gizmo``, whose settings can mark a device Unhealthy).
The tests run in file order and build on each other, as an operator's session would: node
capacity, a pod's view of its widget, a kubelet restart, a device turning Unhealthy and back,
and the host stopping.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8skit import DEVICE_PLUGINS_DIR, Kit, pod_manifest

WIDGET = "example.com/widget"
GIZMO = "gizmos.example.org/gizmo"
LABEL = {"devicehost-e2e": "host-process"}


def host_config(unhealthy: list[str]) -> dict[str, Any]:
    return {
        "enabled_backends": ["example", "gizmo"],
        "backends": {"example": {"resources": {WIDGET: 4}}, "gizmo": {"count": 2, "unhealthy": unhealthy}},
        "health_interval": 1,
        "log_format": "json",
    }


@dataclass
class HostProcess:
    process: subprocess.Popen[bytes]
    config: Path
    log: Path

    def reconfigure(self, unhealthy: list[str]) -> None:
        """Rewrite the config file and send SIGHUP (a reload, as an operator does it)."""
        self.config.write_text(yaml.safe_dump(host_config(unhealthy)))
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def host(kit: Kit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """``devicehost run`` on the node (the e2e env's console script), like the kit README's example."""
    tmp = tmp_path_factory.mktemp("host")
    config, log = tmp / "config.yaml", tmp / "host.log"
    config.write_text(yaml.safe_dump(host_config([])))
    command = [
        str(Path(sys.executable).parent / "devicehost"), "run", "--config", str(config),
        "--device-plugins-dir", str(DEVICE_PLUGINS_DIR),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started = HostProcess(process, config, log)
    try:
        yield started
    finally:
        started.stop()
        kit.kubectl(
            "delete", "pods", "-l", "devicehost-e2e=host-process", "--ignore-not-found", "--wait=true"
        )


def consumer_pod(name: str, image: str, resource: str) -> dict[str, Any]:
    """A pod that asks for one device of ``resource`` and sleeps (the kit's Python base has a shell)."""
    return pod_manifest(
        name, image, LABEL, container={"command": ["sleep", "3600"], "resources": {"limits": {resource: 1}}}
    )


def in_pod(kit: Kit, pod: str, script: str) -> str:
    return kit.kubectl("exec", pod, "--", "sh", "-c", script)


def test_node_offers_every_device_of_both_backends(kit: Kit, host: HostProcess) -> None:
    started = time.monotonic()
    kit.wait_resource(WIDGET, 4, 4)
    kit.wait_resource(GIZMO, 2, 2)
    kit.timings["host start -> node allocatable"] = round(time.monotonic() - started, 1)
    assert host.process.poll() is None


def test_pod_sees_the_env_mount_and_device_node_the_backend_answered(
    kit: Kit, host: HostProcess, python_base: str
) -> None:
    started = time.monotonic()
    pod = kit.run_pod(consumer_pod("widget-one", python_base, WIDGET))
    kit.timings["widget pod created -> running"] = round(time.monotonic() - started, 1)
    widget = in_pod(kit, pod, 'printf %s "$EXAMPLE_WIDGETS"')
    assert widget in {f"widget-{n}" for n in range(4)}, f"EXAMPLE_WIDGETS={widget!r}"
    # The DeviceSpec: /dev/<widget> is the host's /dev/null (char 1:3), writable.
    assert in_pod(
        kit, pod, f"stat -c %F:%t:%T /dev/{widget} && echo x > /dev/{widget} && echo written"
    ).splitlines() == [
        "character special file:1:3",
        "written",
    ]
    # The Mount: the host's /etc, read-only, at /etc/example.
    assert in_pod(kit, pod, "cat /etc/example/debian_version") == Path("/etc/debian_version").read_text()
    assert "read-only" in in_pod(kit, pod, "touch /etc/example/x 2>&1 || true").lower()
    # The kubelet's own record of the allocation (pod-resources API).
    assert widget in kit.run("k8stest-podres")


def test_pod_is_admitted_after_a_kubelet_restart(kit: Kit, host: HostProcess, python_base: str) -> None:
    first = in_pod(kit, "widget-one", 'printf %s "$EXAMPLE_WIDGETS"')
    kit.restart_kubelet()
    started = time.monotonic()
    # The kubelet forgets every plugin on restart; the host registers again and the node shows it.
    kit.wait_resource(WIDGET, 4, 4)
    kit.wait_resource(GIZMO, 2, 2)
    kit.timings["kubelet back -> node allocatable again"] = round(time.monotonic() - started, 1)
    pod = kit.run_pod(consumer_pod("widget-two", python_base, WIDGET))
    second = in_pod(kit, pod, 'printf %s "$EXAMPLE_WIDGETS"')
    assert second.startswith("widget-")
    assert second != first, "the kubelet's checkpoint keeps the first pod's widget taken"


def test_unhealthy_device_leaves_allocatable_and_comes_back(kit: Kit, host: HostProcess) -> None:
    host.reconfigure(unhealthy=["gizmo-1"])
    kit.wait_resource(GIZMO, 2, 1)
    host.reconfigure(unhealthy=[])
    kit.wait_resource(GIZMO, 2, 2)
    # The other backend's resource was never touched.
    assert kit.resource(WIDGET) == (4, 4)
    assert host.process.poll() is None


def test_stopped_host_leaves_nothing_allocatable(kit: Kit, host: HostProcess) -> None:
    assert host.stop() == 0
    assert not [p.name for p in DEVICE_PLUGINS_DIR.glob("devicehost-*")], "sockets left behind"
    started = time.monotonic()
    kit.wait_resource(WIDGET, None, 0)
    kit.wait_resource(GIZMO, None, 0)
    kit.timings["host stopped -> allocatable 0"] = round(time.monotonic() - started, 1)
