"""``devicehost run`` as a process on the kit's node, and what the DRA e2e modules read of pods.

One :class:`DraHost` serves every DRA e2e module: started with command-line arguments
(``--backend dra-example ...``) or a config file, stopped with SIGTERM, reloaded with SIGHUP,
its JSON log lines read by event. The pod helpers read what a container printed (the kit's
envsleep image prints ``ENV KEY=VALUE`` lines) and wait for pods, failing at once on a state
that never turns into Running.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from k8skit import DEVICE_PLUGINS_DIR, Kit, until

ADMIN_KUBECONFIG = "/var/lib/k8s-kit/pki/admin.kubeconfig"
DEVICEHOST = str(Path(sys.executable).parent / "devicehost")
STUCK = {"ErrImageNeverPull", "CreateContainerError", "CreateContainerConfigError", "CrashLoopBackOff"}
"""The container states that never turn into Running by themselves."""


class DraHost:
    """``devicehost run <args>`` on the node, its output (JSON log lines) appended to ``log``."""

    def __init__(self, args: Sequence[str], log: Path, config: Path | None = None) -> None:
        self.args, self.log, self.config = list(args), log, config
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def backend(
        cls, backend: str, node: str, log: Path, settings: Mapping[str, Any] | None = None
    ) -> DraHost:
        """The host serving ``backend`` as an operator starts it on the command line."""
        args = ["--backend", backend]
        args += ["--backend-settings", json.dumps(settings)] if settings is not None else []
        args += ["--node-name", node, "--kubeconfig", ADMIN_KUBECONFIG,
                 "--device-plugins-dir", str(DEVICE_PLUGINS_DIR), "--log-format", "json"]  # fmt: skip
        return cls(args, log)

    @classmethod
    def configured(cls, config: Path, log: Path, settings: Mapping[str, Any] | None = None) -> DraHost:
        """The host reading its settings from the config file ``config`` (written first from
        ``settings`` when given)."""
        if settings is not None:
            config.write_text(yaml.safe_dump(dict(settings)))
        return cls(["--config", str(config)], log, config)

    def start(self) -> DraHost:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [DEVICEHOST, "run", *self.args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reload(self, settings: Mapping[str, Any] | None = None) -> None:
        """SIGHUP: the host reads its config file again (rewritten from ``settings`` when
        given), as an operator reloads it."""
        assert self.process is not None
        if settings is not None:
            assert self.config is not None, "a host started without a config file"
            self.config.write_text(yaml.safe_dump(dict(settings)))
        self.process.send_signal(signal.SIGHUP)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def events(self, event: str) -> list[dict[str, Any]]:
        """The log entries whose ``event`` is ``event`` (lines that are not JSON are passed over)."""
        found = []
        for line in self.log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == event:
                found.append(entry)
        return found

    def ready(self, published: Callable[[], object], what: str) -> None:
        """Wait until ``published`` holds (its slices are there) and the kubelet registered it."""
        until(published, what, within=60)
        until(lambda: self.events("registered with the kubelet"), "the kubelet registered it", 30)

    def finish(self, kit: Kit, tag: str) -> None:
        """Stop it; claims it failed to (un)prepare go to kit.notes; it must have exited 0."""
        code = self.stop()
        for entry in self.events("claim not prepared") + self.events("claim not unprepared"):
            kit.notes.append(f"{tag} host: {json.dumps(entry)}")
        assert code == 0, f"devicehost exited {code}: {self.log.read_text()[-3000:]}"


def dra_config(node: str, backends: Mapping[str, Mapping[str, Any]], **more: Any) -> dict[str, Any]:
    """A config file's settings for a host on the kit's node serving ``backends`` (name ->
    settings) through DRA, logging JSON; ``more`` adds settings (``health_interval=1``)."""
    return {
        "enabled_backends": list(backends),
        "backends": {name: dict(settings) for name, settings in backends.items()},
        "serve_through": dict.fromkeys(backends, "dra"),
        "node_name": node,
        "kubeconfig": ADMIN_KUBECONFIG,
        "device_plugins_dir": str(DEVICE_PLUGINS_DIR),
        "log_format": "json",
        **more,
    }


def driver_slices(kit: Kit, driver: str) -> list[dict[str, Any]]:
    return [s for s in kit.get("resourceslices")["items"] if s["spec"]["driver"] == driver]


def device_count(kit: Kit, driver: str) -> int:
    """How many devices the driver's slices publish, all together."""
    return sum(len(s["spec"].get("devices", [])) for s in driver_slices(kit, driver))


def since(started: float) -> float:
    return round(time.monotonic() - started, 2)


@contextmanager
def feature_gates(
    kit: Kit, gates: Mapping[str, bool], what: str, runtime_config: Mapping[str, bool] | None = None
) -> Iterator[Kit]:
    """``gates`` (and ``runtime_config``) on for the block, the time it took in kit.timings under
    ``what``; the kit's gates (none) and API versions again after it, whatever happened."""
    started = time.monotonic()
    kit.set_feature_gates(gates, runtime_config=runtime_config)
    kit.timings[what] = round(time.monotonic() - started, 1)
    try:
        yield kit
    finally:
        kit.set_feature_gates({}, runtime_config={} if runtime_config is not None else None)


def pods(kit: Kit, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kit.get("pods", "-n", namespace)["items"]}


def wait_running(kit: Kit, namespace: str, names: Sequence[str], within: float = 120) -> None:
    """Wait until the pods run; one that failed, or one of whose containers (init containers too)
    is stuck in a state that never turns into Running, fails at once."""

    def running() -> bool:
        found = pods(kit, namespace)
        for name in names:
            status = found.get(name, {}).get("status", {})
            assert status.get("phase") != "Failed", f"{namespace}/{name} failed: {status}"
            states = status.get("containerStatuses", []) + status.get("initContainerStatuses", [])
            stuck = [
                s["state"]["waiting"] for s in states if s["state"].get("waiting", {}).get("reason") in STUCK
            ]
            assert not stuck, f"{namespace}/{name}: {stuck}"
        return all(found.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

    until(running, f"pods {', '.join(names)} of {namespace} running", within=within)


def event_messages(kit: Kit, namespace: str, name: str, reason: str) -> list[str]:
    """The messages of the events of reason ``reason`` about the object ``name``."""
    found = kit.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return [e["message"] for e in found["items"] if e["reason"] == reason]


def namespace_events(kit: Kit, namespace: str) -> list[str]:
    """Every event of the namespace as ``<object> <reason>: <message>``, oldest first (what a
    failure shows)."""
    found = kit.get("events", "-n", namespace, "--sort-by=.metadata.creationTimestamp")["items"]
    return [f"{e['involvedObject']['name']} {e['reason']}: {e['message']}" for e in found]


def first_event(kit: Kit, namespace: str, name: str, reason: str, within: float = 90) -> str:
    """Wait for an event of reason ``reason`` about the object ``name``; the first one's message."""
    (message, *_) = until(lambda: event_messages(kit, namespace, name, reason), f"{name} {reason}", within)
    return message


def printed_env(kit: Kit, namespace: str, pod: str, container: str) -> dict[str, str]:
    """The environment the container printed (envsleep's ``ENV KEY=VALUE`` lines)."""
    lines = until(
        lambda: [
            ln for ln in kit.logs("-n", namespace, pod, "-c", container).splitlines() if ln.startswith("ENV ")
        ],
        f"{namespace}/{pod}/{container} printing its environment",
        within=30,
    )
    return dict(line.removeprefix("ENV ").partition("=")[::2] for line in lines)


def container_env(
    kit: Kit, tag: str, namespace: str, pod: str, container: str, driver: str
) -> dict[str, str]:
    """:func:`printed_env` of a container given devices of ``driver`` (it must say so in
    ``DRA_RESOURCE_DRIVER_NAME``); its GPU and DRA lines go to kit.notes (after ``tag``) and out."""
    env = printed_env(kit, namespace, pod, container)
    shown = sorted(f"{k}={v}" for k, v in env.items() if k.startswith(("GPU_DEVICE_", "NET_DEVICE_", "DRA_")))
    kit.notes.append(f"{tag} {namespace} {pod}/{container}: {' '.join(shown)}")
    print(f"{namespace} {pod}/{container}:", *shown, sep="\n  ")
    assert env.get("DRA_RESOURCE_DRIVER_NAME") == driver, shown
    return env


def claim_pod(
    namespace: str, name: str, claim: Mapping[str, str], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A pod whose one container ``ctr0`` (the kit's envsleep image: it prints its environment)
    uses one claim: ``claim`` is its pod-level entry, ``{"name": ..., "resourceClaimName": ...}``
    or ``... "resourceClaimTemplateName": ...``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, **({"labels": dict(labels)} if labels else {})},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [dict(claim)],
            "containers": [
                {
                    "name": "ctr0",
                    "image": "localhost/envsleep:v1",
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": claim["name"]}]},
                }
            ],
        },
    }
