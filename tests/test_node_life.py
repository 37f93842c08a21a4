"""What a node does to the host, with the real host process: reboots, kills at each step of a
prepare and an unprepare (the host's own and inside the backend's hooks), late and racing calls.

After each: every claim the kubelet holds is prepared once with its CDI spec on disk (its IDs
resolving as containerd resolves them), every card is held by exactly the claims that hold it,
and the checkpoint matches (``Node.check``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from nodelife import DRIVER, POOL, Node, a_node

from devicehost.host.dra import steps
from devicehost.resourceapi import AllocatedDevice, ClaimAllocation
from devicehost.standin import DraCallError
from devicehost.standin.cdi_runtime import resolve


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="nl-", dir="/tmp"))
    try:
        async with a_node(root) as made:
            yield made
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def booted(node: Node, kill_at: str = "", **settings: object) -> None:
    """The host started and registered, its cards published."""
    host = await node.start_host(kill_at, **settings)
    await node.registered(host)
    await node.api.wait(lambda api: len(api.devices(DRIVER)) == 4, timeout=10)


async def test_a_reboot_writes_every_spec_again_before_the_driver_registers(node: Node) -> None:
    await booted(node)
    refs = [node.claim("card-0"), node.claim("card-1")]
    first = [await node.prepare(ref) for ref in refs]
    node.check()
    await node.reboot()
    specs = {f"devicehost-{DRIVER}_claim-{ref[1]}.json" for ref in refs}
    assert specs <= set(node.specs_at_registration[-1])  # on disk before the kubelet knew the driver
    assert (await node.dra_status())["restored_claims"] == 2
    assert sorted(r["claim"] for r in node.hooks("restore")) == sorted(ref[1] for ref in refs)
    node.check()  # the kubelet still counts them prepared: their specs resolve without asking again
    again = [await node.prepare(ref) for ref in refs]  # the 1.35 kubelet asks again anyway
    assert again == first
    assert len(node.hooks("allocate")) == 2  # answered from the checkpoint, not allocated again
    node.check()


async def test_a_reboot_leaves_the_device_plugin_sides_cdi_names_resolving(node: Node) -> None:
    """The device plugin side's specs are the backend's own, written in its start hook, which
    runs before the resource registers: what the kubelet was handed resolves again by then."""
    config = node.root / "example.yaml"
    settings = {"backends": {"example": {"cdi": True}}, "cdi_dir": str(node.cdi), "device_release": False}
    config.write_text(yaml.safe_dump(settings))
    widget = "example.com/widget"
    names = []
    for boot in range(2):
        if boot:
            await node.power_cycle()
        await node.run_host(["example"], config)
        assert node.kubelet is not None
        await node.kubelet.wait_for_resource(widget, healthy=4, timeout=20)
        resolve(names, [node.cdi])  # handed out before the reboot: defined again once registered
        answer = await node.kubelet.allocate_ids(widget, ["widget-1"])
        names = [c.name for c in answer.container_responses[0].cdi_devices]
        assert names
        resolve(names, [node.cdi])


async def test_a_reboot_writes_the_device_metadata_specs_again_before_the_driver_registers(
    node: Node,
) -> None:
    await booted(node, metadata=True)
    ref = node.claim("card-2")
    ids = [i for d in await node.prepare(ref) for i in d.cdi_ids]
    assert any("/metadata-" in i for i in ids)
    await node.reboot(metadata=True)
    assert f"devicehost-{DRIVER}_metadata-{ref[1]}.json" in node.specs_at_registration[-1]
    resolve(ids, [node.cdi])  # what the kubelet was handed resolves without asking again


async def test_a_host_restarted_alone_writes_a_missing_spec_again(node: Node) -> None:
    await booted(node)
    ref = node.claim("card-2")
    await node.prepare(ref)
    await node.kill_host()
    (node.cdi / f"devicehost-{DRIVER}_claim-{ref[1]}.json").unlink()  # lost, or removed by hand
    await booted(node)
    node.check()
    assert (await node.prepare(ref))[0].device == "card-2"
    node.check()


async def test_a_backend_that_refuses_to_restore_fails_that_claim_alone(node: Node) -> None:
    await booted(node)
    ref = node.claim("card-0")
    await node.prepare(ref)
    host = await node.reboot(refuse_restore=True)
    said = await host.wait_for_log("claim not restored", uid=ref[1])
    assert "cannot set up card-0 again" in said["error"]
    status = await node.dra_status()
    assert (status["restored_claims"], len(status["not_restored"])) == (0, 1)
    assert status["not_restored"][0].startswith(f"{ref[1]}: ")
    node.held.clear()  # unprepared at the start: the kubelet's next prepare starts afresh
    node.check()
    await node.prepare(ref)
    node.check()


PREPARE_STEPS = [s for s in steps.STEPS if s.startswith("prepare-")]
UNPREPARE_STEPS = [s for s in steps.STEPS if s.startswith("unprepare-")]


@pytest.mark.parametrize("step", PREPARE_STEPS)
async def test_a_kill_at_each_step_of_a_prepare_ends_prepared_once(node: Node, step: str) -> None:
    await booted(node, kill_at=step)
    ref = node.claim("card-1")
    with pytest.raises(DraCallError):
        await node.prepare(ref)
    assert await node.host_died() == -9
    await booted(node)
    await node.prepare(ref)  # the kubelet's retry
    node.check()


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
async def test_a_kill_at_each_step_of_an_unprepare_ends_unprepared_once(node: Node, step: str) -> None:
    await booted(node, kill_at=step)
    kept, ref = node.claim("card-0"), node.claim("card-1")
    await node.prepare(kept)
    await node.prepare(ref)
    with pytest.raises(DraCallError):
        await node.unprepare(ref)
    assert await node.host_died() == -9
    await booted(node)
    await node.unprepare(ref)  # the kubelet's retry
    node.check()
    assert [r["ids"] for r in node.hooks("release")] == [["card-1"]]  # never the kept claim's card


@pytest.mark.parametrize("hook", ["allocate", "release"])
async def test_a_backend_that_kills_the_host_inside_its_hook_is_survived(node: Node, hook: str) -> None:
    await booted(node)
    ref = node.claim("card-3")
    if hook == "release":
        await node.prepare(ref)
    node.kill_in(hook)
    with pytest.raises(DraCallError):
        await (node.prepare(ref) if hook == "allocate" else node.unprepare(ref))
    assert await node.host_died() == -9
    await booted(node)
    await (node.prepare(ref) if hook == "allocate" else node.unprepare(ref))
    node.check()


async def test_a_backend_that_kills_the_host_while_restoring_is_restored_at_the_next_start(
    node: Node,
) -> None:
    await booted(node)
    ref = node.claim("card-2")
    await node.prepare(ref)
    node.kill_in("restore")
    await node.kill_host()
    await node.start_host()
    assert await node.host_died() == -9  # inside the restore hook, before registering
    await booted(node)
    node.check()


async def test_an_unreadable_checkpoint_is_set_aside_and_the_host_starts(node: Node) -> None:
    await booted(node)
    await node.kill_host()
    node.checkpoint.write_text('{"version": 2, "claims": {"torn')
    host = await node.start_host()
    said = await host.wait_for_log("prepared claims checkpoint unreadable, set aside: starting without it")
    aside = list(node.checkpoint.parent.glob("devicehost-claims.json.unreadable-*"))
    assert [p.name for p in aside] == [said["problem"].rpartition("set aside as ")[2]]
    await node.registered(host)
    assert (await node.dra_status())["checkpoint_set_aside"] == [str(aside[0])]
    await node.prepare(node.claim("card-0"))
    node.check()


async def test_late_prepares_are_refused_and_change_nothing(node: Node) -> None:
    await booted(node)
    held, gone, moved = node.claim("card-0"), node.claim("card-1"), node.claim("card-2")
    await node.prepare(held)
    del node.api.claims[(gone[0], gone[2])]  # deleted since
    node.api.claims[(moved[0], moved[2])] = ClaimAllocation(
        moved[1], (AllocatedDevice("card", DRIVER, POOL.replace("node-a", "node-b"), "card-2"),)
    )  # allocated again, on another node
    with pytest.raises(DraCallError, match="404"):
        await node.prepare(gone)
    with pytest.raises(DraCallError, match="is not served by this host"):
        await node.prepare(moved)
    await node.unprepare(("default", "never-prepared", "nobody"))  # unknown: done, nothing changes
    node.check()


async def test_prepare_and_unprepare_racing_end_as_the_last_call(node: Node) -> None:
    await booted(node)
    ref = node.claim("card-3")
    node.front.read_delay = 0.5  # the claim's read takes a while
    preparing = asyncio.ensure_future(node.prepare(ref))
    await asyncio.sleep(0.2)
    await node.unprepare(ref)  # the kubelet gave up on the prepare and unprepares
    with pytest.raises(DraCallError, match="was unprepared after this prepare was asked for"):
        await preparing
    node.held.pop(ref[1], None)
    node.check()
    node.front.read_delay = 0.0
    await node.unprepare(ref)
    await node.prepare(ref)  # and the other way round: prepared
    node.check()
    raw = json.loads(node.checkpoint.read_text())
    assert list(raw["claims"]) == [ref[1]]
