"""NodePrepareResources round trip: the host serving through DRA against a bare DRAPlugin servicer.

Two server processes, started side by side and called alternately by this process as the
kubelet would (one long-lived channel to each DRA socket):

- **host**: the real host (:func:`devicehost.host.app.running`, as ``devicehost run`` builds it,
  logging JSON to a file) serving the benchmark's backend through DRA, with the in-memory API
  server :class:`~devicehost.testing.cluster.ClusterStandIn` as its ``Cluster``; the benchmark
  reaches its DRA socket through the registration socket, as the kubelet's plugin watcher does.
  Per claim it reads the claim from the stand-in, calls the allocate hook, writes the claim's
  CDI spec (fsync of the file and the directory) and the checkpoint (fsync), then answers.
- **bare**: a plain grpc.aio ``DRAPluginServicer`` that a vendor could write by hand.

"The same answers" means two things here, both checked on the first call of every round:

1. the same ``NodePrepareResourcesResponse`` message, field for field: same claim UIDs,
   request names, pool, device names and CDI device IDs (``<driver>/claim-<uid>=req.widget``);
2. the same durable work before answering: the bare writes the same CDI spec JSON, byte for
   byte, the same way (temporary file, fsync, rename, fsync of the directory) and records the
   claim in a JSON checkpoint file written the same way (temporary file, fsync, rename), as any
   driver must (the Go reference writes a CDI spec and a checkpoint per claim too). Unprepare
   removes the spec and rewrites the checkpoint in both.

So the ratio measures what the host adds on top of the work every correct driver does, not the
price of durability. Each call prepares NEW claims: before each call the benchmark allocates
fresh claims (one device each) in the host's stand-in (``ClusterStandIn.allocate``) and tells
the bare the same claims; after the call both are unprepared (outside the timing) and the
claims forgotten, so the devices are free for the next call. A repeated prepare would be
answered from the checkpoint and would measure nothing.

``python -m benchmarks.dra_prepare --serve host|bare --dir DIR --log LOG`` runs one server
(the measurement launches them). Its stdin takes JSON lines: ``["alloc", [device, ...]]``
(host: forget the previous claims, allocate one claim per device; prints the claims as JSON
``[[namespace, uid, name, pool, device], ...]``), ``["claims", [[namespace, uid, name, pool,
device], ...]]`` (bare: the same, taken as given; prints ``ok``). The first line it prints is
its DRA socket. EOF stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from benchmarks.figures import Figure, Target, compared, ms, percentile
from benchmarks.procs import ServerProcess, _spawn, running
from benchmarks.settings import Settings
from devicehost._files import write_atomically
from devicehost.proto.dra.v1 import api_pb2, api_pb2_grpc

MEASUREMENT = "dra_prepare"
RESOURCE = "dra.example.com/widget"
DRIVER = "dra.example.com"
NODE = "bench-node"
REQUEST = "req"
DEVICES = 16
COUNTS = (1, 8)
"""Claims per NodePrepareResources call, one device each."""
WARMUP = 20
TARGETS = {50: Target("<=", 1.2), 99: Target("<=", 1.2)}
START_TIMEOUT = 30.0
Claim = list[str]
"""[namespace, uid, name, pool, device]."""


def samples_for(settings: Settings, count: int) -> int:
    """Calls measured per server for ``count`` claims a call: about 25 s in all in full mode
    (700 and 200 calls) on 2 cores, scaled with the allocate measurement's sample count."""
    return max(20, settings.allocate_samples * 7 // 20 if count == 1 else settings.allocate_samples // 10)


# -- the answer both servers give, computed by hand in the bare ---------------------------------


def device_id(device: str) -> str:
    return device  # ``widget-<n>`` is a DNS label: its DRA name is itself


def spec_json(kind: str, device: str) -> str:
    """The claim's CDI spec as the host writes it for the benchmark backend's allocation."""
    edits = {
        "env": [f"EXAMPLE_WIDGETS={device_id(device)}"],
        "deviceNodes": [{"path": f"/dev/{device_id(device)}", "hostPath": "/dev/null", "permissions": "rw"}],
        "mounts": [{"hostPath": "/etc", "containerPath": "/etc/example", "options": ["bind", "ro"]}],
    }
    spec = {
        "cdiVersion": "0.6.0",
        "kind": kind,
        "devices": [{"name": f"{REQUEST}.widget", "containerEdits": edits}],
    }
    return json.dumps(spec, indent=2) + "\n"


def write_durably(path: Path, text: str, mode: int | None = None) -> None:
    """Temporary file beside ``path``, fsync, rename over it, as the host writes both files (its
    own function: the baseline does the same file work, without the host around it)."""
    write_atomically(path, text, mode)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Context = grpc.aio.ServicerContext[Any, Any]


class BareDra(api_pb2_grpc.DRAPluginServicer):
    """Claims given by the benchmark; prepare writes the CDI spec and checkpoint, then answers."""

    def __init__(self, directory: Path) -> None:
        self.cdi_dir = directory / "cdi"
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = directory / "checkpoint.json"
        self.allocations: dict[str, Claim] = {}
        self.prepared: dict[str, dict[str, Any]] = {}
        self._lock = asyncio.Lock()

    def _spec_path(self, uid: str) -> tuple[str, Path]:
        kind = f"{DRIVER}/claim-{uid}"
        return kind, self.cdi_dir / f"devicehost-{kind.replace('/', '_')}.json"

    def _write_checkpoint(self) -> None:
        data = {"version": 1, "claims": self.prepared}
        write_durably(self.checkpoint_path, json.dumps(data, indent=1, sort_keys=True))

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: Context
    ) -> api_pb2.NodePrepareResourcesResponse:
        response = api_pb2.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                namespace, uid, name, pool, device = self.allocations[claim.uid]
                kind, path = self._spec_path(uid)
                cdi_id = f"{kind}={REQUEST}.widget"
                if uid not in self.prepared:
                    write_durably(path, spec_json(kind, device), 0o644)
                    fsync_directory(self.cdi_dir)
                    self.prepared[uid] = {
                        "namespace": namespace,
                        "name": name,
                        "devices": [{"pool": pool, "device": device, "cdi_ids": [cdi_id]}],
                    }
                    self._write_checkpoint()
                response.claims[uid].devices.append(
                    api_pb2.Device(
                        request_names=[REQUEST], pool_name=pool, device_name=device, cdi_device_ids=[cdi_id]
                    )
                )
        return response

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: Context
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        response = api_pb2.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                if self.prepared.pop(claim.uid, None) is not None:
                    self._spec_path(claim.uid)[1].unlink(missing_ok=True)
                    fsync_directory(self.cdi_dir)
                    self._write_checkpoint()
                response.claims[claim.uid].error = ""
        return response


async def serve_bare(directory: Path) -> None:
    servicer = BareDra(directory)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    api_pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)
    socket = directory / "dra.sock"
    socket.unlink(missing_ok=True)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    print(socket, flush=True)
    try:
        async for command, claims in commands():
            assert command == "claims"
            servicer.allocations = {c[1]: c for c in claims}
            print("ok", flush=True)
    finally:
        await server.stop(0)


# -- the host, in its own process -----------------------------------------------------------------


async def commands() -> AsyncIterator[tuple[str, Any]]:
    """Stdin's JSON lines, read without blocking the loop, until EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command, argument = json.loads(line)
        yield command, argument


async def serve_host(directory: Path) -> None:
    from benchmarks.host_server import PushBackend
    from devicehost.host.app import running as running_host
    from devicehost.host.backends.backend import Backend
    from devicehost.host.config import HostConfig
    from devicehost.standin.kubelet import KubeletStandIn
    from devicehost.testing.cluster import ClusterStandIn

    cluster = ClusterStandIn()
    registry = directory / "registry"
    config = HostConfig(
        device_plugins_dir=directory / "dp",
        plugins_registry_dir=registry,
        dra_plugins_dir=directory / "plugins",
        cdi_dir=directory / "cdi",
        serve_through={"bench": "dra"},
        node_name=NODE,
        device_release=False,
        pod_resources_socket=directory / "pod-resources.sock",
    )
    backend = PushBackend({RESOURCE: DEVICES})  # the example backend's answer
    async with (
        KubeletStandIn(directory / "dp", registry) as kubelet,  # registers the driver: it publishes
        running_host(config, [Backend("bench", backend, config.hook_timeout)], cluster=lambda: cluster),
    ):
        endpoint = await kubelet.dra.wait_for_driver(DRIVER, START_TIMEOUT)
        await cluster.wait(lambda c: len(c.devices(DRIVER)) == DEVICES, timeout=START_TIMEOUT)
        print(endpoint, flush=True)
        async for command, devices in commands():
            assert command == "alloc"
            cluster.claims.clear()  # the previous call's claims are unprepared: forget them
            made = []
            for device in devices:
                namespace, uid, name = cluster.allocate(DRIVER, 1, request=REQUEST, devices=[device])
                pool = cluster.claims[(namespace, name)].devices[0].pool
                made.append([namespace, uid, name, pool, device])
            print(json.dumps(made), flush=True)


# -- the measurement ------------------------------------------------------------------------------


async def launch_server(kind: str, directory: Path, log: Path) -> tuple[ServerProcess, str]:
    """One server process and its DRA socket (the server makes ``directory``)."""
    argv = [sys.executable, "-m", "benchmarks.dra_prepare", "--serve", kind, "--dir", str(directory)]
    server = await _spawn([*argv, "--log", str(log.with_suffix(".json"))], log, {}, piped=True)
    assert server.proc.stdout is not None
    try:
        line = await asyncio.wait_for(server.proc.stdout.readline(), START_TIMEOUT)
    except TimeoutError:
        await server.stop()
        raise
    if not line:
        await server.stop()
        raise RuntimeError(f"the {kind} DRA server exited before serving; see {log}")
    return server, line.decode().strip()


async def ask(server: ServerProcess, command: str, argument: Any) -> Any:
    """One stdin command; its one-line answer."""
    assert server.proc.stdin is not None
    assert server.proc.stdout is not None
    server.proc.stdin.write(json.dumps([command, argument]).encode() + b"\n")
    await server.proc.stdin.drain()
    answer = await asyncio.wait_for(server.proc.stdout.readline(), START_TIMEOUT)
    return json.loads(answer) if answer.strip() != b"ok" else None


def claims_of(claims: Sequence[Claim]) -> list[api_pb2.Claim]:
    return [api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name, _, _ in claims]


def state_dir(workdir: Path) -> Path:
    """Where both servers keep sockets, CDI specs and checkpoints: tmpfs when there is one.

    A node's CDI dir (``/var/run/cdi``) is tmpfs; on this machine's disk each fsync costs about
    5 ms, the same for both servers, which would hide what the host adds under the disk's noise.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="dhb-dra-", dir=shm))
    return Path(tempfile.mkdtemp(prefix=f"{MEASUREMENT}-", dir=workdir))


async def measure(settings: Settings, workdir: Path) -> list[Figure]:
    directory = state_dir(workdir)
    try:
        return await _measure(settings, workdir, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _measure(settings: Settings, workdir: Path, directory: Path) -> list[Figure]:
    rng = random.Random(1)
    figures: list[Figure] = []
    host_server, host_socket = await launch_server("host", directory / "host", workdir / "dra-host.log")
    async with running(host_server) as host:
        bare_server, bare_socket = await launch_server("bare", directory / "bare", workdir / "dra-bare.log")
        async with (
            running(bare_server) as bare,
            grpc.aio.insecure_channel(f"unix:{host_socket}") as host_channel,
            grpc.aio.insecure_channel(f"unix:{bare_socket}") as bare_channel,
        ):
            stubs = {
                "host": api_pb2_grpc.DRAPluginStub(host_channel),
                "bare": api_pb2_grpc.DRAPluginStub(bare_channel),
            }
            servers = {"host": host, "bare": bare}
            for count in COUNTS:
                samples: dict[str, list[float]] = {"host": [], "bare": []}
                cpu: dict[str, float] = {}
                total = samples_for(settings, count)
                for n in range(WARMUP + total):
                    if n == WARMUP:
                        cpu = {name: server.cpu_seconds() for name, server in servers.items()}
                    devices = [f"widget-{i}" for i in rng.sample(range(DEVICES), count)]
                    claims = await ask(host, "alloc", devices)
                    await ask(bare, "claims", claims)
                    request = api_pb2.NodePrepareResourcesRequest(claims=claims_of(claims))
                    answers = {}
                    for name in ("host", "bare") if n % 2 else ("bare", "host"):
                        started = time.perf_counter()
                        answers[name] = await stubs[name].NodePrepareResources(request, timeout=10)
                        if n >= WARMUP:
                            samples[name].append(time.perf_counter() - started)
                    if n == 0:
                        check_same(answers, claims, directory)
                    undo = api_pb2.NodeUnprepareResourcesRequest(claims=claims_of(claims))
                    for name, stub in stubs.items():
                        undone = await stub.NodeUnprepareResources(undo, timeout=10)
                        if any(c.error for c in undone.claims.values()):
                            raise RuntimeError(f"{name} did not unprepare: {undone}")
                for pct, target in TARGETS.items():
                    host_ms, bare_ms = (ms(percentile(samples[name], pct)) for name in ("host", "bare"))
                    figures += compared(
                        MEASUREMENT, f"{count} claim(s) p{pct}", host_ms, bare_ms, "ms", target
                    )
                per_call = {
                    name: (server.cpu_seconds() - cpu[name]) / total * 1e6 for name, server in servers.items()
                }
                figures += compared(
                    MEASUREMENT,
                    f"{count} claim(s) server CPU per call",
                    round(per_call["host"], 1),
                    round(per_call["bare"], 1),
                    "us",
                )
    return figures


def check_same(
    answers: dict[str, api_pb2.NodePrepareResourcesResponse], claims: Sequence[Claim], directory: Path
) -> None:
    """Both answered the same message, with no error, and wrote the same CDI spec bytes."""
    if answers["host"] != answers["bare"]:
        raise AssertionError(f"host and bare answers differ:\n{answers['host']}\n--\n{answers['bare']}")
    for _, uid, *_ in claims:
        answer = answers["host"].claims[uid]
        if answer.error or len(answer.devices) != 1:
            raise AssertionError(f"claim {uid} not prepared: {answer}")
        spec = f"devicehost-{DRIVER}_claim-{uid}.json"
        host, bare = ((directory / kind / "cdi" / spec).read_bytes() for kind in ("host", "bare"))
        if host != bare:
            raise AssertionError(f"CDI specs differ for {uid}:\n{host.decode()}\n--\n{bare.decode()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", choices=["host", "bare"], required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    for made in (args.dir, args.dir / "dp", args.dir / "registry"):
        made.mkdir(parents=True, exist_ok=True)
    if args.serve == "bare":
        asyncio.run(serve_bare(args.dir))
        return
    from devicehost.host.logs import configure_logging

    with args.log.open("w") as log_file:
        configure_logging("info", "json", log_file)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_host(args.dir))


if __name__ == "__main__":
    main()
