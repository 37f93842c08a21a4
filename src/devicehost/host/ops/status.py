"""The host's state for people and probes: what ``/status`` serves and ``devicehost status`` prints."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devicehost.host.daemon import Host


def stuck_hooks(host: Host) -> dict[str, list[str]]:
    """Hooks running past the hook timeout, by backend (only backends that have some)."""
    return {name: hooks for name, backend in host.backends.items() if (hooks := backend.stuck_hooks())}


def host_status(host: Host) -> dict[str, Any]:
    """A JSON-ready snapshot: backends, resources, kubelet, readiness and liveness."""
    resources = {
        name: {
            "backend": server.backend.name,
            "socket": str(server.path),
            "registered": server.registered,
            "streams": server.servicer.open_streams,
            "devices": len(server.table.devices),
            "healthy": server.table.healthy_count(),
            "registrations": server.registrations,
            "allocations": server.servicer.allocations,
        }
        for name, server in sorted(host.resources.items())
    }
    stuck = stuck_hooks(host)
    return {
        "kubelet": {"socket": str(host.watcher.kubelet_socket), "present": host.watcher.inode is not None},
        "backends": {
            **{name: {"status": "loaded", "stuck_hooks": stuck.get(name, [])} for name in host.backends},
            **{name: {"status": "failed", "reason": reason} for name, reason in host.failed_backends.items()},
        },
        "resources": resources,
        "ready": all(r["registered"] for r in resources.values()),
        "live": not stuck,
    }


def print_status(address: str) -> int:
    """Fetch ``/status`` from a running host and print it for a person; 1 when unreachable."""
    if not address:
        print("devicehost: no address: pass --address HOST:PORT or set metrics_address", file=sys.stderr)
        return 2
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=5) as reply:
            state = json.load(reply)
    except (OSError, urllib.error.URLError) as exc:
        print(f"devicehost: no host answers at {address}: {exc}", file=sys.stderr)
        return 1
    print(f"kubelet: {state['kubelet']['socket']} ({'present' if state['kubelet']['present'] else 'absent'})")
    print(f"ready: {'yes' if state['ready'] else 'no'}   live: {'yes' if state['live'] else 'no'}")
    print("backends:")
    for name, info in state["backends"].items():
        detail = info.get("reason") or ", ".join(info.get("stuck_hooks", [])) or ""
        print(f"  {name:<16} {info['status']}{'  ' + detail if detail else ''}")
    print("resources:")
    for name, r in state["resources"].items():
        print(
            f"  {name:<40} {r['backend']:<12} {'registered' if r['registered'] else 'NOT registered':<15}"
            f" {r['healthy']}/{r['devices']} healthy  streams={r['streams']}"
            f" registrations={r['registrations']} allocations={r['allocations']}"
        )
    return 0
