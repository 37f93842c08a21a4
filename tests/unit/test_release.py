"""Device release (``host/release.py``) over the stand-in's real pod-resources server
(``standin/pod_resources.py``) read by the host's client (``host/kubelet/pod_resources.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devicehost.host.config import HostConfig
from devicehost.host.kubelet.pod_resources import PodResourcesError, list_holders
from devicehost.host.release import (
    ReleaseTracker,
    missing,
    released_sets,
    tracker_for,
    with_holders,
)
from devicehost.host.state import Holder, ResourceState
from devicehost.standin.pod_resources import PodAssignments, PodResourcesServer, write_checkpoint

WIDGET = "example.com/widget"
APP = Holder("default", "app", "main")
SIDE = Holder("default", "app", "side")


@pytest.fixture
async def pod_resources(short_tmp: Path) -> AsyncIterator[tuple[PodAssignments, Path]]:
    """The stand-in's pod-resources server on a socket of its own, and what it serves."""
    assignments = PodAssignments()
    server = PodResourcesServer(assignments, lambda: {WIDGET: ["w0", "w1", "w2"]})
    socket = short_tmp / "pod-resources" / "kubelet.sock"
    await server.serve(socket)
    yield assignments, socket
    await server.stop(socket)
    assert not socket.exists()


def test_released_devices_are_grouped_by_the_container_that_held_them() -> None:
    gone = {(WIDGET, "w2"): APP, (WIDGET, "w0"): APP, (WIDGET, "w1"): SIDE}
    assert released_sets(gone) == {(WIDGET, APP): ("w0", "w2"), (WIDGET, SIDE): ("w1",)}


def test_missing_is_what_was_held_and_is_no_more() -> None:
    before = {WIDGET: {"w0": APP, "w1": SIDE}, "example.com/gizmo": {"g0": APP}}
    now = {WIDGET: {"w1": SIDE}}
    assert missing(before, now) == {(WIDGET, "w0"): APP, ("example.com/gizmo", "g0"): APP}
    assert missing(now, before) == {}


def test_without_device_release_nothing_is_tracked_and_nothing_is_held(tmp_path: Path) -> None:
    config = HostConfig(device_release=False, device_plugins_dir=tmp_path)
    assert tracker_for(config, dict) is None
    state = ResourceState(WIDGET, "ex", "w.sock", True, 1, {"Healthy": 2}, {}, 0, 0, {})
    assert with_holders(None, state) is state


async def test_a_look_reads_who_holds_what_and_a_device_gone_twice_is_released(
    pod_resources: tuple[PodAssignments, Path], short_tmp: Path
) -> None:
    assignments, socket = pod_resources
    assignments.assign(("default", "app"), "main", WIDGET, ["w0", "w1"])
    assert await list_holders(socket, 5) == {WIDGET: {"w0": APP, "w1": APP}}
    tracker = ReleaseTracker(socket, short_tmp, 60, dict)
    await tracker.look()
    assert (tracker.status, set(tracker.holders[WIDGET])) == ("on", {"w0", "w1"})
    state = ResourceState(WIDGET, "ex", "w.sock", True, 1, {"Healthy": 3}, {}, 0, 0, {})
    assert with_holders(tracker, state).holders == {"w0": APP, "w1": APP}

    assignments.remove_pod(("default", "app"))
    await tracker.look()  # gone once: not yet released (a kubelet may answer half-synced)
    assert tracker._pending == {(WIDGET, "w0"): APP, (WIDGET, "w1"): APP}
    await tracker.look()  # gone twice: released (no server serves the resource, so no hook runs)
    assert (tracker._pending, tracker.holders) == ({}, {})


async def test_a_missing_socket_pauses_release_and_changes_nothing(short_tmp: Path) -> None:
    socket = short_tmp / "nowhere.sock"
    with pytest.raises(PodResourcesError, match="no pod-resources socket at"):
        await list_holders(socket, 5)
    tracker = ReleaseTracker(socket, short_tmp, 60, dict)
    tracker.holders = {WIDGET: {"w0": APP}}
    await tracker.look()
    assert tracker.status == f"paused: no pod-resources socket at {socket}"
    assert tracker.holders == {WIDGET: {"w0": APP}}


def test_the_checkpoint_is_written_whole_and_a_change_of_it_is_a_reason_to_look(short_tmp: Path) -> None:
    assignments = PodAssignments()
    tracker = ReleaseTracker(short_tmp / "pr.sock", short_tmp, 60, dict)
    assignments.on_change = lambda: write_checkpoint(tracker.checkpoint, assignments)
    assignments.assign(("default", "app"), "main", WIDGET, ["w0"])
    assert tracker.checkpoint.read_text().count('"DeviceIDs": ["w0"]') == 1
    assert [p.name for p in short_tmp.iterdir()] == [tracker.checkpoint.name]  # no temporary left
    tracker.poke("another-file")
    assert not tracker._wake.is_set()
    tracker.poke(tracker.checkpoint.name)
    assert tracker._wake.is_set()
