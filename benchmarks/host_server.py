"""The host in its own process with a backend the benchmark can poke: health changes on command.

``python -m benchmarks.host_server --dir DIR --resources name=8,... --mode push|poll`` runs the
real :class:`~devicehost.host.daemon.Host` (through ``devicehost.host.app.running``) (logging as ``devicehost run`` does, to ``--log``).
A line ``push <resource> <Healthy|Unhealthy>`` on stdin changes device 0's health and prints the
``time.monotonic()`` of the change: in ``push`` mode through the ResourceNotifier given in
``devicehost_start``, in ``poll`` mode only in the state ``devicehost_health`` returns. A line
``tasks`` prints how many asyncio tasks the host's loop holds. EOF stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import devicehost
from benchmarks.bare_server import count_tasks, parse_resources
from devicehost import ContainerAllocation, Device, DeviceSpec, Health, Mount, Resource
from devicehost.host.app import running
from devicehost.host.backends.backend import Backend
from devicehost.host.config import HostConfig
from devicehost.host.daemon import Host
from devicehost.host.logs import configure_logging


class PushBackend:
    """The example backend's resources and Allocate answer, plus health changes on command."""

    def __init__(self, resources: Mapping[str, int]) -> None:
        self.resources = dict(resources)
        self.notifiers: dict[str, devicehost.ResourceNotifier] = {}
        self.health: dict[str, Health] = {name: Health.HEALTHY for name in resources}
        self.lock = threading.Lock()

    @staticmethod
    def first_id(resource: str) -> str:
        return f"{resource.split('/')[1]}-0"

    def change(self, resource: str, health: Health) -> float:
        """Set device 0's health; the ``time.monotonic()`` at which the backend knew it."""
        changed = time.monotonic()
        with self.lock:
            self.health[resource] = health
        self.notifiers[resource].set_health({self.first_id(resource): health})
        return changed

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        """Every device, device 0 with its current health (rediscovery must not undo a change)."""
        with self.lock:
            return [
                Resource(
                    name,
                    tuple(
                        Device(
                            f"{name.split('/')[1]}-{n}", self.health[name] if n == 0 else Health.HEALTHY, (0,)
                        )
                        for n in range(count)
                    ),
                )
                for name, count in self.resources.items()
            ]

    @devicehost.hookimpl
    def devicehost_start(self, resource: str, notifier: devicehost.ResourceNotifier) -> None:
        with self.lock:
            self.notifiers[resource] = notifier

    @devicehost.hookimpl
    def devicehost_allocate(self, resource: str, device_ids: tuple[str, ...]) -> ContainerAllocation:
        short = resource.split("/")[1]
        return ContainerAllocation(
            envs={f"EXAMPLE_{short.upper().replace('-', '_').replace('.', '_')}S": ",".join(device_ids)},
            mounts=[Mount(container_path="/etc/example", host_path="/etc", read_only=True)],
            devices=[
                DeviceSpec(container_path=f"/dev/{device_id}", host_path="/dev/null", permissions="rw")
                for device_id in device_ids
            ],
        )


class PollBackend(PushBackend):
    """Tells health only when the host polls ``devicehost_health``."""

    def change(self, resource: str, health: Health) -> float:
        changed = time.monotonic()
        with self.lock:
            self.health[resource] = health
        return changed

    @devicehost.hookimpl
    def devicehost_health(self, resource: str) -> dict[str, Health]:
        with self.lock:
            return {self.first_id(resource): self.health[resource]}


def read_commands(loop: asyncio.AbstractEventLoop, backend: PushBackend, host: Host) -> None:
    """Stdin reader thread, as a backend's own watcher thread; EOF stops the host."""
    for line in sys.stdin:
        if line.strip() == "tasks":
            print(count_tasks(loop), flush=True)
            continue
        _, resource, health = line.split()
        print(backend.change(resource, Health(health)), flush=True)
    loop.call_soon_threadsafe(host.request_stop)


async def main(args: argparse.Namespace) -> None:
    backend = (PollBackend if args.mode == "poll" else PushBackend)(args.resources)
    config = HostConfig(device_plugins_dir=args.dir, health_interval=args.health_interval)
    async with running(config, [Backend("bench", backend, config.hook_timeout)]) as host:
        threading.Thread(
            target=read_commands, args=(asyncio.get_running_loop(), backend, host), daemon=True
        ).start()
        await host.stopping.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--resources", type=parse_resources, required=True)
    parser.add_argument("--mode", choices=["push", "poll"], default="push")
    parser.add_argument("--health-interval", type=float, default=5.0)
    parser.add_argument("--log", type=Path, required=True)
    arguments = parser.parse_args()
    with arguments.log.open("w") as log_file:
        configure_logging("info", "json", log_file)
        asyncio.run(main(arguments))
