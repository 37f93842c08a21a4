"""A claim's allocate and release hook calls (``host/dra/hooks.py``): all of a claim's requests
or none, and a release only of what no other claim holds, against a real Backend and checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from drafakes import Recorder, attached, fake_server

from devicehost import Device, Share
from devicehost.host.dra import hooks
from devicehost.host.dra.allocated import ClaimRefused, requests_of
from devicehost.host.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from devicehost.host.dra.cluster import AllocatedDevice, ClaimAllocation

DRIVER = "example.com"
WIDGET = "example.com/widget"
POOL = "node-a/widget"
LOG = structlog.get_logger("test")


def claim(*devices: tuple[str, str]) -> ClaimAllocation:
    allocated = tuple(AllocatedDevice(r, DRIVER, POOL, d) for r, d in devices)
    return ClaimAllocation("uid-c", allocated, namespace="default", name="c")


async def test_a_failed_allocation_gives_back_what_the_earlier_requests_allocated(tmp_path: Path) -> None:
    plugin = Recorder()
    plugin.answers["w2"] = RuntimeError("card w2 is gone")
    with fake_server(plugin, [Device(f"w{n}") for n in range(3)]) as server:
        resources = {WIDGET: attached(server, POOL)}
        checkpoint = Checkpoint(tmp_path / "claims.json")
        requests = requests_of(claim(("a", "w0"), ("a", "w1"), ("b", "w2")), DRIVER, resources, False)
        with pytest.raises(ClaimRefused, match="card w2 is gone"):
            async with hooks.allocated(requests, checkpoint, resources, LOG):
                pytest.fail("the block runs only when every request is allocated")
    assert [ids for _, ids, _ in plugin.allocated] == [("w0", "w1"), ("w2",)]
    assert plugin.released == [(WIDGET, ("w0", "w1"))]  # request a's, not the failed one's


async def test_a_refusal_in_the_block_gives_back_every_request(tmp_path: Path) -> None:
    plugin = Recorder()
    with fake_server(plugin, [Device(f"w{n}") for n in range(3)]) as server:
        resources = {WIDGET: attached(server, POOL)}
        checkpoint = Checkpoint(tmp_path / "claims.json")
        checkpoint.add(PreparedClaim("uid-other", "default", "o", (planned("w1"),)))  # held by another
        requests = requests_of(claim(("a", "w0"), ("b", "w1")), DRIVER, resources, False)
        seen = []

        async def spec_not_written() -> None:
            async with hooks.allocated(requests, checkpoint, resources, LOG) as given:
                seen.extend(a.envs for a in given)
                raise ClaimRefused("CDI spec for the claim: disk full")

        with pytest.raises(ClaimRefused, match="disk full"):
            await spec_not_written()
    assert seen == [{"IDS": "w0"}, {"IDS": "w1"}]
    assert plugin.released == [(WIDGET, ("w0",))]  # w1 stays: the other claim holds it


def test_release_calls_leave_out_held_devices_and_give_each_share_its_own_call() -> None:
    share = PreparedDevice("s", POOL, "w3", WIDGET, "w3", (), share="sh-1", consumed={"memory": "1Gi"})
    devices = [planned("w0"), planned("w1"), share]
    calls = hooks.release_calls(devices, lambda key: key == (WIDGET, "w1"), ("default/c", "uid-c"))
    assert [(resource, ids) for resource, ids, _ in calls] == [(WIDGET, ("w0",)), (WIDGET, ("w3",))]
    asked = calls[1][2]
    assert asked is not None
    assert (asked.name, asked.uid, asked.shares) == ("s", "uid-c", {"w3": Share("sh-1", {"memory": "1Gi"})})


def planned(device: str) -> PreparedDevice:
    return PreparedDevice("a", POOL, device, WIDGET, device, ())
