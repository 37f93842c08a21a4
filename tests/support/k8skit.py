"""The real single-node cluster of the kit named by ``$DEVICEHOST_K8S_KIT``, as the e2e tests drive it.

The kit's own scripts do the work (``up.sh``, ``down.sh``, ``images/*.sh``); this module runs
them, runs the kit's ``kubectl`` with its kubeconfig, and waits on cluster state with bounded
polling. Nothing here is a stand-in: every answer comes from the API server or the kubelet.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from devicehost.standin.versions import FEATURES, KubernetesVersion, parse

KIT_ENV = "DEVICEHOST_K8S_KIT"
"""Names the kit's directory; unset, the e2e tests are skipped."""
PYTHON_BASE = "localhost/python-base:bookworm"
"""The kit's Debian bookworm image with python3 (3.11) and python3-venv (images/python-base.sh)."""
KUBELET_PID = Path("/run/k8s-kit/kubelet.pid")
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_LOG = Path("/var/lib/k8s-kit/logs/kubelet.log")
KIT_RUN = Path("/run/k8s-kit")
KIT_LOGS = Path("/var/lib/k8s-kit/logs")
GATED_DAEMONS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
"""Started by up.sh with no --feature-gates; restarted with some by :meth:`Kit.set_feature_gates`."""
# What the kubelet logs about device plugins (the lines worth reading after a scenario).
DEVICE_PLUGIN_WORDS = (
    "ListAndWatch", "Deregistered", "Mark all resources", "Endpoint became", "Device plugin", "Probe failed",
    "Registered endpoint", "Got registration request",
)  # fmt: skip

T = TypeVar("T")


def until(check: Callable[[], T | None], what: str, within: float = 60.0, every: float = 0.5) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {within:.0f} s: {what}")
        time.sleep(every)


def pod_manifest(
    name: str,
    image: str,
    labels: Mapping[str, str],
    *,
    container: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A test pod in ``default``: one container of a local ``image`` (never pulled), no restarts,
    1 s to terminate; ``container`` adds to the container, ``spec`` to the pod spec."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": dict(labels)},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "consumer", "image": image, "imagePullPolicy": "Never", **(container or {})}
            ],
            **spec,
        },
    }


def _alive(pid: int) -> bool:
    """``pid`` runs (an exited child of this process is reaped here, not counted as running)."""
    with contextlib.suppress(ChildProcessError):  # not our child: its parent reaps it
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _stop(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s, as down.sh stops the kit's daemons (the API server can
    take a minute to drain its watches)."""
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        until(lambda: not _alive(pid), f"pid {pid} to exit after SIGKILL", within=10, every=0.1)


def kit_dir() -> Path | None:
    """The kit named by $DEVICEHOST_K8S_KIT, or None when it is unset or not a kit."""
    name = os.environ.get(KIT_ENV)
    if not name:
        return None
    path = Path(name)
    return path if (path / "up.sh").is_file() and (path / "down.sh").is_file() else None


@dataclass(frozen=True)
class ClusterDra:
    """What the kit's cluster is of DRA: its Kubernetes version (as the stand-ins' table,
    ``devicehost.standin.versions``, knows it) and the ``resource.k8s.io`` versions it serves."""

    version: KubernetesVersion
    served: frozenset[str]
    """``resource.k8s.io`` versions served now (``v1``, ``v1beta2``, ...)."""

    def gates(self, *gates: str) -> dict[str, bool]:
        """Of ``gates``, those this version has but keeps off by default: the ones to turn on."""
        return {g: True for g in gates if not self.version.enabled(g) and _has(self.version, g)}

    @property
    def taint_rule_api(self) -> str:
        """The ``resource.k8s.io`` version to write DeviceTaintRules in: the newest that has them
        (1.34, 1.35: v1alpha3; 1.36: v1beta2; 1.37: v1)."""
        return next(v for v in ("v1", "v1beta2", "v1alpha3") if v in self.version.taint_rule_versions)

    def runtime_config(self, *versions: str) -> dict[str, bool]:
        """``--runtime-config`` entries serving ``versions`` of resource.k8s.io (none served already)."""
        return {f"resource.k8s.io/{v}": True for v in versions if v not in self.served}


@contextlib.contextmanager
def dra_gates(
    kit: Kit, dra: ClusterDra, what: str, gates: Sequence[str], apis: Sequence[str] = ()
) -> Iterator[dict[str, bool]]:
    """For the block, turn on those of ``gates`` the cluster's version keeps off and serve those of
    ``apis`` (resource.k8s.io versions) it does not: the four daemons restart only when something
    is missing, and again after the block with the kit's gates (none). Yields what was turned on
    (empty: the version has it all by default); the restart's time goes to kit.timings."""
    needed, served = dra.gates(*gates), dra.runtime_config(*apis)
    if not needed and not served:
        kit.notes.append(
            f"{what}: {', '.join(gates)} on by default in {dra.version.version}, nothing restarted"
        )
        yield {}
        return
    started = time.monotonic()
    kit.set_feature_gates(needed, runtime_config=served or None)
    kit.timings[f"{what}: {', '.join([*needed, *served])} on (4 daemons restarted)"] = round(
        time.monotonic() - started, 1
    )
    try:
        yield needed | served
    finally:
        kit.set_feature_gates({}, runtime_config={} if served else None)


def _has(version: KubernetesVersion, gate: str) -> bool:
    return any(f.gate == gate and version.version in f.stages for f in FEATURES)


@dataclass
class Kit:
    """One kit directory; the cluster it runs is this machine's only cluster."""

    root: Path
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = "/var/lib/k8s-kit/pki/admin.kubeconfig"
        env["PATH"] = f"/var/cache/k8s-kit/bin:{env.get('PATH', '')}"
        return env

    def run(self, *argv: str | Path, timeout: float = 300, stdin: str | None = None) -> str:
        """Run a command with the kit's environment; its stdout, or a failure with its output."""
        result = subprocess.run(
            [str(a) for a in argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"{' '.join(map(str, argv))} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                f"{result.stderr[-3000:]}"
            )
        return result.stdout

    def timed(self, what: str, *argv: str | Path, timeout: float = 300) -> str:
        """``run``, with its wall time kept in ``timings[what]`` (reported by the session)."""
        started = time.monotonic()
        out = self.run(*argv, timeout=timeout)
        self.timings[what] = round(time.monotonic() - started, 1)
        return out

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        return self.run("kubectl", *args, stdin=stdin, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def apply_all(self, manifests: Sequence[Mapping[str, Any]]) -> None:
        """Apply the documents in one ``kubectl apply``, in order."""
        self.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(m) for m in manifests))

    def node(self) -> dict[str, Any]:
        nodes = self.get("nodes")["items"]
        assert len(nodes) == 1, f"the kit runs one node, the API server lists {len(nodes)}"
        node: dict[str, Any] = nodes[0]
        return node

    def resource(self, name: str) -> tuple[int, int]:
        """(capacity, allocatable) of an extended resource on the node; (0, 0) when absent."""
        status = self.node()["status"]
        return int(status.get("capacity", {}).get(name, 0)), int(status.get("allocatable", {}).get(name, 0))

    def wait_resource(self, name: str, capacity: int | None, allocatable: int, within: float = 60) -> None:
        """Wait until the node reports ``allocatable`` (and ``capacity`` unless None) of ``name``."""

        def reached() -> bool:
            have = self.resource(name)
            return have[1] == allocatable and capacity in (None, have[0])

        until(reached, f"{name}: capacity {capacity}, allocatable {allocatable}", within)

    def dra(self) -> ClusterDra:
        """The cluster's version and served ``resource.k8s.io`` versions, read from the API server.
        ValueError (naming the version) for one outside 1.34 to 1.37, which the tests do not know."""
        server = json.loads(self.kubectl("version", "-o", "json"))["serverVersion"]
        minor = "".join(ch for ch in server["minor"] if ch.isdigit())
        version = parse(f"{server['major']}.{minor}")
        groups = self.kubectl("api-versions").split()
        served = frozenset(g.partition("/")[2] for g in groups if g.startswith("resource.k8s.io/"))
        return ClusterDra(version, served)

    def set_feature_gates(
        self, gates: Mapping[str, bool], runtime_config: Mapping[str, bool] | None = None
    ) -> None:
        """Restart the control plane and the kubelet with ``--feature-gates`` (an empty mapping
        restarts them without); each keeps the rest of the command line up.sh gave it.
        ``runtime_config`` (alpha API versions, ``{"resource.k8s.io/v1alpha3": True}``) replaces
        the API server's ``--runtime-config`` (an empty mapping: none); None keeps what it has.

        The kit reads its settings (K8S_KIT_FEATURE_GATES, K8S_KIT_RUNTIME_CONFIG) only in up.sh,
        so each daemon is restarted the way up.sh started it:
        detached, in its own session, with the same log and pid file; down.sh stops it as usual.
        """
        flag = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(gates.items()))
        apis = ",".join(f"{name}={str(on).lower()}" for name, on in sorted((runtime_config or {}).items()))
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        commands = {}
        for daemon in GATED_DAEMONS:  # every command line first: stopping one may end another
            pid = int((KIT_RUN / f"{daemon}.pid").read_text())
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            commands[daemon] = (pid, [a.decode() for a in raw if not a.startswith(b"--feature-gates=")])
        for daemon in reversed(GATED_DAEMONS):
            _stop(commands[daemon][0])
        for daemon in GATED_DAEMONS:
            argv = commands[daemon][1]
            argv = [*argv, f"--feature-gates={flag}"] if flag else argv
            if daemon == "kube-apiserver" and runtime_config is not None:
                argv = [a for a in argv if not a.startswith("--runtime-config=")]
                argv = [*argv, f"--runtime-config={apis}"] if apis else argv
            self._start_detached(daemon, argv)
            if daemon == "kube-apiserver":
                until(lambda: self._ready(), "kube-apiserver /readyz", within=90)
        until(lambda: self._heartbeat_since(since), "the node Ready with a new kubelet heartbeat", within=90)

    def restart_apiserver(self, flags: Mapping[str, str | None]) -> None:
        """Restart kube-apiserver with each of ``flags`` set (``{"--enable-aggregator-routing":
        "true"}``), or removed where None; the rest of its command line as it was. Waits for /readyz."""
        pid = int((KIT_RUN / "kube-apiserver.pid").read_text())
        raw = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
        argv = [a for a in raw if a.partition("=")[0] not in flags]
        argv += [f"{name}={value}" for name, value in flags.items() if value is not None]
        _stop(pid)
        self._start_detached("kube-apiserver", argv)
        until(lambda: self._ready(), "kube-apiserver /readyz", within=90)

    def _start_detached(self, daemon: str, argv: Sequence[str]) -> None:
        """Start ``daemon`` as up.sh does: setsid in the background, its pid echoed, the shell gone
        at once (the daemon belongs to init, not to this process); same log and pid file."""
        detach = 'setsid "$@" >>"$0" 2>&1 </dev/null & echo $!'
        pid = int(self.run("sh", "-c", detach, KIT_LOGS / f"{daemon}.log", *argv, timeout=30))
        (KIT_RUN / f"{daemon}.pid").write_text(f"{pid}\n")

    def _ready(self) -> bool:
        try:
            return self.kubectl("get", "--raw", "/readyz", timeout=10).strip() == "ok"
        except AssertionError:
            return False

    def _heartbeat_since(self, since: str) -> bool:
        conditions = self.node()["status"]["conditions"]
        ready = next(c for c in conditions if c["type"] == "Ready")
        return bool(ready["status"] == "True" and ready["lastHeartbeatTime"] >= since)

    def restart_kubelet(self) -> None:
        """Stop the kubelet, wait for the process to end, start it again with up.sh (as the kit says)."""
        pid = int(KUBELET_PID.read_text())
        os.kill(pid, signal.SIGTERM)
        until(lambda: not Path(f"/proc/{pid}").exists(), f"kubelet {pid} to exit", within=30, every=0.2)
        self.timed("kubelet restart (up.sh)", self.root / "up.sh", timeout=180)

    def run_pod(self, manifest: Mapping[str, Any], within: float = 90) -> str:
        """Create the pod and wait until it runs; its name. A pod that fails, or whose image or
        container cannot be had, fails at once with its status."""
        self.apply(manifest)
        name: str = manifest["metadata"]["name"]

        def running() -> bool:
            pod = self.get("pod", name)
            waiting = [s["state"].get("waiting", {}) for s in pod["status"].get("containerStatuses", [])]
            assert pod["status"]["phase"] != "Failed", f"{name} failed: {pod['status']}"
            stuck = [w for w in waiting if w.get("reason") in {"ErrImageNeverPull", "CreateContainerError"}]
            assert not stuck, stuck
            return bool(pod["status"]["phase"] == "Running")

        until(running, f"pod {name} running", within=within)
        return name

    def images(self) -> set[str]:
        out = self.run(
            "ctr", "-a", "/run/k8s-kit/containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q"
        )
        return set(out.split())

    def buildah(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Debian's buildah on the kit's storage (as images/buildah-build.sh runs it)."""
        store = ["--root", "/var/cache/k8s-kit/buildah/storage", "--runroot", "/run/k8s-kit-buildah"]
        argv = ["buildah", *store, "--storage-driver", "vfs", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    def ensure_python_base(self) -> None:
        """The kit's Python base in containerd (pods) and buildah's storage (builds); built once.

        buildah is installed first (the kit's scripts do the same when it is missing), so that
        images/python-base.sh loads the base into buildah's storage too.
        """
        if shutil.which("buildah") is None:
            self.timed(
                "apt-get install buildah",
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "buildah",
            )
        if PYTHON_BASE not in self.images() or self.buildah("inspect", PYTHON_BASE).returncode != 0:
            self.timed(
                "python base (images/python-base.sh)", self.root / "images" / "python-base.sh", timeout=600
            )

    def build_image(self, tag: str, context: Path, *bud_args: str) -> None:
        """``images/buildah-build.sh``: buildah bud, then import into the cluster's containerd."""
        self.timed(
            f"image build {tag}",
            self.root / "images" / "buildah-build.sh",
            tag,
            context,
            *bud_args,
            timeout=900,
        )
        assert tag in self.images(), f"{tag} built but not in containerd"

    def logs(self, *args: str) -> str:
        result = subprocess.run(
            ["kubectl", "logs", *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=60,
            check=False,
        )
        return result.stdout + result.stderr

    def kubelet_log_offset(self) -> int:
        return KUBELET_LOG.stat().st_size if KUBELET_LOG.exists() else 0

    def kubelet_log(self, since: int) -> list[str]:
        """The kubelet's device-plugin lines written after offset ``since``."""
        with KUBELET_LOG.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        return [line for line in text.splitlines() if any(word in line for word in DEVICE_PLUGIN_WORDS)]
