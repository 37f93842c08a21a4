"""A node for the node-life suite: the real host process, the kubelet and API server stand-ins,
and what a node does to them (kill the host, reboot, call late), with the checks after each.

The host runs as ``devicehost run`` serving the ``nodelife`` test backend
(tests/backends/devicehost-nodelife) through DRA; the API server stand-in is reached over HTTP
(:mod:`apihttp`), so claims outlive the host; the backend journals each allocate, release and
restore as the hardware would keep them, so a check sees which devices are held and how often.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from apihttp import ApiHttp, serving
from probing import free_port, get

from devicehost.standin import DraDevice, KubeletStandIn
from devicehost.standin.apiserver import ApiServerStandIn
from devicehost.standin.cdi_runtime import resolve
from devicehost.testing.host import HostProcess, host_process

DRIVER = "nodelife.example.org"
NODE = "node-a"
POOL = f"{NODE}/card"
CHECKPOINT = Path("plugins") / DRIVER / "devicehost-claims.json"

ClaimRef = tuple[str, str, str]


@dataclass
class Node:
    """One node's dirs (``root``), its API server, kubelet and host; what the kubelet holds."""

    root: Path
    api: ApiServerStandIn
    front: ApiHttp
    kubelet: KubeletStandIn | None = None
    host: HostProcess | None = None
    held: dict[str, tuple[DraDevice, ...]] = field(default_factory=dict)
    """Claim UID -> the devices of its last prepare answer, for each claim the kubelet counts prepared."""
    status_port: int = field(default_factory=free_port)
    """Where the host serves ``/status``."""
    specs_at_registration: list[list[str]] = field(default_factory=list)
    """The CDI dir's files at each moment the kubelet registered the driver."""
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    def config(self, **settings: Any) -> Path:
        """The host's config file, the backend's ``settings`` added."""
        backend = {"journal": str(self.root / "journal"), "kill_file": str(self.root / "kill"), **settings}
        config = {
            "enabled_backends": ["nodelife"],
            "backends": {"nodelife": backend},
            "serve_through": {"nodelife": "dra"},
            "node_name": NODE,
            "kubeconfig": str(self.front.kubeconfig),
            "dra_plugins_dir": str(self.root / "plugins"),
            "plugins_registry_dir": str(self.root / "registry"),
            "pod_resources_socket": str(self.root / "pod-resources" / "kubelet.sock"),
            "cdi_dir": str(self.cdi),
            "device_release": False,
            "metrics_address": f"127.0.0.1:{self.status_port}",
        }
        path = self.root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    async def start_kubelet(self) -> None:
        kubelet = KubeletStandIn(self.root / "device-plugins", self.root / "registry")
        register = kubelet.dra.register

        async def seen_registering(driver: str, endpoint: str) -> str | None:
            self.specs_at_registration.append(sorted(p.name for p in self.cdi.glob("*.json")))
            return await register(driver, endpoint)

        kubelet.dra.register = seen_registering  # type: ignore[method-assign]
        await kubelet.start()
        self.kubelet = kubelet

    async def start_host(self, kill_at: str = "", **settings: Any) -> HostProcess:
        """``devicehost run`` serving the nodelife backend (killed at the step ``kill_at`` names)."""
        return await self.run_host(["nodelife"], self.config(**settings), kill_at)

    async def run_host(self, backends: list[str], config: Path, kill_at: str = "") -> HostProcess:
        """``devicehost run`` of ``backends`` with the config file ``config``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEHOST_")}
        if kill_at:
            env["DEVICEHOST_KILL_AT"] = kill_at
        plugins = self.root / "device-plugins"
        host = await self._stack.enter_async_context(
            host_process(plugins, backends, config_file=config, env=env, cdi_dir=self.cdi)
        )
        self.host = host
        return host

    async def registered(self, host: HostProcess) -> None:
        await host.wait_for_log("registered with the kubelet", timeout=20)

    async def kill_host(self) -> None:
        """SIGKILL, as a crash: nothing of the host's own cleanup runs."""
        if self.host is not None and self.host.process.returncode is None:
            self.host.process.send_signal(signal.SIGKILL)
            await self.host.process.wait()

    async def host_died(self) -> int:
        assert self.host is not None
        return await asyncio.wait_for(self.host.process.wait(), 15)

    async def power_cycle(self) -> None:
        """Kill the host and the kubelet, empty the CDI dir (a tmpfs) and the hardware's state,
        keep the checkpoint's dir; start the kubelet again."""
        await self.kill_host()
        assert self.kubelet is not None
        await self.kubelet.stop()
        shutil.rmtree(self.cdi, ignore_errors=True)
        self.cdi.mkdir()
        self.journal_line({"hook": "reboot"})
        await self.start_kubelet()

    async def reboot(self, **settings: Any) -> HostProcess:
        """:meth:`power_cycle`, then the host started again and registered."""
        await self.power_cycle()
        host = await self.start_host(**settings)
        await self.registered(host)
        return host

    async def dra_status(self) -> dict[str, Any]:
        """What ``/status`` says of the card resource's DRA side."""
        code, body = await get(self.status_port, "/status")
        assert code == 200, body
        resources = json.loads(body)["resources"]
        dra: dict[str, Any] = resources[f"{DRIVER}/card"]["dra"]
        return dra

    def journal_line(self, line: Mapping[str, Any]) -> None:
        with (self.root / "journal").open("a", encoding="utf-8") as journal:
            journal.write(json.dumps(dict(line)) + "\n")

    def kill_in(self, hook: str) -> None:
        """The backend kills its own process inside ``hook``, once."""
        (self.root / "kill").write_text(hook)

    # -- the kubelet's calls -------------------------------------------------------------------

    def claim(self, device: str) -> ClaimRef:
        """A claim of one card, allocated as the scheduler would."""
        return self.api.allocate(DRIVER, devices=[device], request="card")

    async def prepare(self, ref: ClaimRef) -> tuple[DraDevice, ...]:
        """NodePrepareResources as the kubelet calls it; what it answers must resolve at once."""
        assert self.kubelet is not None
        answer = (await self.kubelet.dra.prepare(DRIVER, [ref], timeout=10))[ref[1]]
        ids = [i for d in answer for i in d.cdi_ids]
        assert len(ids) == len(set(ids)), f"a CDI ID twice in the answer: {ids}"
        resolve(ids, [self.cdi])  # the runtime, when the container starts right after
        self.held[ref[1]] = answer
        return answer

    async def unprepare(self, ref: ClaimRef) -> None:
        assert self.kubelet is not None
        await self.kubelet.dra.unprepare(DRIVER, [ref], timeout=10)
        self.held.pop(ref[1], None)

    # -- what must hold ------------------------------------------------------------------------

    def hardware(self) -> dict[str, int]:
        """Each card the backend holds now, with how many claims hold it; "held twice" problems
        are raised (an allocate of a card held already, since the last reboot)."""
        held: dict[str, int] = {}
        path = self.root / "journal"
        for line in path.read_text().splitlines() if path.exists() else []:
            entry = json.loads(line)
            if entry["hook"] == "reboot":
                held = {}
            for device in entry.get("ids", ()):
                if entry["hook"] == "allocate":
                    assert device not in held, f"{device} allocated while held: {line}"
                    held[device] = 1
                elif entry["hook"] == "release":
                    held.pop(device, None)
                elif entry["hook"] == "restore":
                    held[device] = 1
        return held

    def check(self) -> None:
        """Every claim the kubelet holds is prepared once with its spec on disk and its CDI IDs
        resolving; every card is held by exactly the claims that hold it; the checkpoint matches."""
        claims = json.loads(self.checkpoint.read_text())["claims"] if self.checkpoint.exists() else {}
        assert {uid: c.get("phase", "prepared") for uid, c in claims.items()} == dict.fromkeys(
            self.held, "prepared"
        )
        for uid, answer in self.held.items():
            assert (self.cdi / f"devicehost-{DRIVER}_claim-{uid}.json").is_file(), f"no spec for {uid}"
            resolve([i for d in answer for i in d.cdi_ids], [self.cdi])
            assert [d["device"] for d in claims[uid]["devices"]] == [d.device for d in answer]
        cards = [d["device_id"] for c in claims.values() for d in c["devices"]]
        assert len(cards) == len(set(cards)), f"a card in two claims: {cards}"
        assert self.hardware() == dict.fromkeys(cards, 1), "the backend holds other cards than the claims"
        specs = {p.name for p in self.cdi.glob(f"devicehost-{DRIVER}_claim-*.json")}
        assert specs == {f"devicehost-{DRIVER}_claim-{uid}.json" for uid in self.held}, "a spec left behind"

    def hooks(self, hook: str) -> list[dict[str, Any]]:
        path = self.root / "journal"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [line for line in lines if line["hook"] == hook]


@asynccontextmanager
async def a_node(root: Path) -> AsyncIterator[Node]:
    """A node with its API server and kubelet up, no host yet."""
    api = ApiServerStandIn()
    for name in ("cdi", "registry", "plugins", "device-plugins"):
        (root / name).mkdir()
    async with serving(api, root) as front:
        node = Node(root, api, front)
        await node.start_kubelet()
        try:
            yield node
        finally:
            await node.kill_host()
            await node._stack.aclose()
            if node.kubelet is not None:
                await node.kubelet.stop()
