"""The host's state for people and probes: what ``/status`` serves and ``devicehost status`` prints.

:func:`document` reads only a :class:`~devicehost.host.state.HostState`; :func:`print_status` reads
only the document, fetched over HTTP from a running host.
"""

from __future__ import annotations

import datetime
import json
import sys
import urllib.error
import urllib.request
from dataclasses import asdict
from typing import Any

from devicehost.host.state import DraState, HostState, ReloadState, ResourceState


def _resource(state: ResourceState) -> dict[str, Any]:
    return {
        "backend": state.backend,
        "socket": state.socket,
        "registered": state.registered,
        "streams": state.streams,
        "devices": state.device_count,
        "healthy": state.healthy,
        "registrations": state.registration_count,
        "allocations": state.allocations,
        "holders": {device: str(holder) for device, holder in sorted(state.holders.items())},
        "releases": state.releases,
        "releasing": list(state.releasing),
        "failed_tries": state.failed_tries,
        "hook_timeouts": dict(state.hook_timeouts),
        "masked": {side: list(ids) for side, ids in state.masked.items() if _serves(state, side)},
        **({"superseded_by": state.superseded_by} if state.superseded_by else {}),
        **({"dra": _dra(state.dra)} if state.dra is not None else {}),
    }


def _dra(dra: DraState) -> dict[str, Any]:
    """How the resource is served through DRA; its driver's counts are the metrics' (not here)."""
    return {k: v for k, v in asdict(dra).items() if k != "calls"}


def _serves(state: ResourceState, side: str) -> bool:
    """Whether the resource is served through ``side`` (``device-plugin`` or ``dra``)."""
    return bool(state.socket) if side == "device-plugin" else state.dra is not None


def _reloads(reloads: ReloadState) -> dict[str, Any]:
    last = reloads.last_refused
    return {
        "applied": reloads.applied,
        "refused": reloads.refused,
        "latest_refused": reloads.latest_refused,
        "last_refused": None
        if last is None
        else {
            "at": datetime.datetime.fromtimestamp(last.at, datetime.UTC).isoformat(timespec="seconds"),
            "what": last.what,
            "why": last.why,
        },
    }


def document(state: HostState) -> dict[str, Any]:
    """The JSON-ready ``/status`` document: kubelet, backends, resources, readiness and liveness."""
    loaded = [b for b in state.backends if b.loaded]
    failed = [b for b in state.backends if not b.loaded]
    return {
        "kubelet": {"socket": state.kubelet.socket, "present": state.kubelet.present},
        "backends": {
            **{
                b.name: {
                    "status": "loaded",
                    "stuck_hooks": list(b.stuck_hooks),
                    **({"discovery_error": b.discovery_error} if b.discovery_error else {}),
                    **({"refused": dict(sorted(b.refused.items()))} if b.refused else {}),
                }
                for b in loaded
            },
            **{b.name: {"status": "failed", "reason": b.reason} for b in failed},
        },
        "resources": {r.name: _resource(r) for r in sorted(state.resources, key=lambda r: r.name)},
        "device_release": state.device_release,
        "reloads": _reloads(state.reloads),
        "ready": state.ready,
        "live": state.live,
        "problems": list(state.problems),
    }


def print_status(address: str) -> int:
    """Fetch ``/status`` from a running host and print it for a person; 1 when unreachable."""
    if not address:
        print("devicehost: no address: pass --address HOST:PORT or set metrics_address", file=sys.stderr)
        return 2
    hostname, _, port = address.rpartition(":")
    if hostname in ("", "0.0.0.0", "::"):
        hostname = "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{hostname}:{port}/status", timeout=5) as reply:
            state = json.load(reply)
    except (OSError, urllib.error.URLError) as exc:
        print(f"devicehost: no host answers at {address}: {exc}", file=sys.stderr)
        return 1
    print(f"kubelet: {state['kubelet']['socket']} ({'present' if state['kubelet']['present'] else 'absent'})")
    print(f"ready: {'yes' if state['ready'] else 'no'}   live: {'yes' if state['live'] else 'no'}")
    for problem in state.get("problems", []):
        print(f"  not ready: {problem}")
    print("backends:")
    for name, info in state["backends"].items():
        detail = (
            info.get("reason")
            or (f"discovery failed: {info['discovery_error']}" if info.get("discovery_error") else "")
            or ", ".join(info.get("stuck_hooks", []))
        )
        print(f"  {name:<16} {info['status']}{'  ' + detail if detail else ''}")
    print("resources:")
    for name, r in state["resources"].items():
        print(
            f"  {name:<40} {r['backend']:<12} {'registered' if r['registered'] else 'NOT registered':<15}"
            f" {r['healthy']}/{r['devices']} healthy  streams={r['streams']}"
            f" registrations={r['registrations']} allocations={r['allocations']}"
        )
        timeouts = r.get("hook_timeouts", {})
        if timeouts:
            print(
                "    hook timeouts: "
                + ", ".join(f"{hook} {seconds:g} s" for hook, seconds in timeouts.items())
            )
        for side, ids in r.get("masked", {}).items():
            print(f"    masked for {side}: {', '.join(ids)}")
        for device, holder in r.get("holders", {}).items():
            print(f"    {device:<38} held by {holder}")
    print(f"device release: {state.get('device_release', 'off')}")
    reloads = state.get("reloads", {})
    last = reloads.get("last_refused")
    if last:
        now = "the latest reload" if reloads.get("latest_refused") else "an earlier reload"
        print(f"reload refused ({now}): {last['what']} at {last['at']}: {last['why']}")
    return 0
