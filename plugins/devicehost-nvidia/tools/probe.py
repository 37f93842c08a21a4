"""Exercise the nvidia backend against this machine's NVML and print what it finds.

Run on a GPU node, from the repository root, after ``pip install -e plugins/devicehost-nvidia``::

    .venv/bin/python plugins/devicehost-nvidia/tools/probe.py [--settings JSON] [--watch SECONDS]

It configures the backend (default settings unless ``--settings`` gives others), discovers,
starts the health watcher, polls health, asks for a preferred allocation of two devices and
allocates it, then listens for XID/ECC events for ``--watch`` seconds. Exit status 1 when no
GPU was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Mapping, Sequence

from devicehost import Device, Health, PreferredAllocationRequest
from devicehost.hookspecs import rules
from devicehost_nvidia import NvidiaBackend


class PrintingNotifier:
    """Prints what the health watcher pushes."""

    def set_health(self, health: Mapping[str, Health]) -> None:
        print(f"  notifier: {dict((k, str(v)) for k, v in health.items())}", flush=True)

    def set_devices(self, devices: Sequence[Device]) -> None:
        print(f"  notifier: set_devices({[d.id for d in devices]})", flush=True)

    def rediscover(self) -> None:
        print("  notifier: rediscover()", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="{}", help="backends.nvidia settings as JSON")
    parser.add_argument("--watch", type=float, default=5.0, help="seconds to listen for events")
    args = parser.parse_args()

    backend = NvidiaBackend()
    backend.devicehost_configure(json.loads(args.settings))
    resources = backend.devicehost_discover()
    if not resources:
        print("no NVIDIA GPU found (see the log line above)")
        return 1
    (resource,) = resources
    print(f"resource {resource.name}: {len(resource.devices)} devices")
    for device in resource.devices:
        print(f"  {device.id}  {device.health}  numa={list(device.numa_nodes)}")
    print(f"device ID problems: {rules.device_ids_problem(d.id for d in resource.devices)}")

    backend.devicehost_start(resource.name, PrintingNotifier())
    try:
        health = backend.devicehost_health(resource.name, resource.devices) or {}
        print(f"health poll: {dict((k, str(v)) for k, v in health.items())}")

        available = tuple(d.id for d in resource.devices)
        size = min(2, len(available))
        request = PreferredAllocationRequest(available, (), size)
        preferred = list(backend.devicehost_preferred_allocation(resource.name, request))
        print(f"preferred allocation of {size}: {preferred}")
        print(f"  problems: {rules.preferred_allocation_problem(preferred, available, (), size)}")

        allocation = backend.devicehost_allocate(resource.name, tuple(preferred))
        print(f"allocate {preferred}:")
        print(f"  envs={dict(allocation.envs)} cdi={list(allocation.cdi_devices)}")
        print(f"  devices={[d.host_path for d in allocation.devices]}")
        print(f"  problems: {rules.allocation_problem(allocation)}")

        print(f"listening for XID / double-bit ECC events for {args.watch} s ...", flush=True)
        threading.Event().wait(args.watch)
        health = backend.devicehost_health(resource.name, resource.devices) or {}
        print(f"health poll: {dict((k, str(v)) for k, v in health.items())}")
    finally:
        backend.devicehost_stop(resource.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
