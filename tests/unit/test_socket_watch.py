"""KubeletSocketWatch and file_identity over a real device-plugins dir under /tmp.

``kubelet.sock`` is a real AF_UNIX socket (listening where a kubelet would be); where the type of
the file does not matter a plain file stands in. ``run()`` runs as a task, so inotify (and, for a
dir that is deleted and recreated, the POLL_INTERVAL fallback) is the real one. Tests wait on
events or on bounded polling of the watch's state, never on bare sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from asyncinotify import Inotify, Mask, Watch
from waiting import WITHIN, eventually

from devicehost.host.kubelet import socket_watch
from devicehost.host.kubelet.socket_watch import KubeletSocketWatch, file_identity


def identity_of(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def inotify_fds() -> int:
    """How many inotify descriptors this process has open."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                count += 1
    return count


class Kubelet:
    """Listening ``kubelet.sock`` files in one dir, as kubelets that start and stop would make."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "kubelet.sock"
        self._sockets: list[socket.socket] = []

    def start(self) -> int:
        """Listen on a new kubelet.sock file; return its inode."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sockets.append(sock)
        sock.bind(os.fspath(self.path))
        sock.listen()
        return os.lstat(self.path).st_ino

    def stop(self) -> None:
        """Remove kubelet.sock (the old listener stays open, so its inode cannot be reused)."""
        self.path.unlink()

    def restart(self) -> int:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop listening on every kubelet.sock made so far (the files stay)."""
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[Kubelet]:
    kubelet = Kubelet(plugin_dir)
    yield kubelet
    kubelet.close()


class Calls:
    """A subscriber that counts its calls and records the generation and file name seen at each."""

    def __init__(self, watch: KubeletSocketWatch) -> None:
        self.watch = watch
        self.generations: list[int] = []
        self.names: list[str | None] = []

    def __call__(self, changed: str | None) -> None:
        self.generations.append(self.watch.generation)
        self.names.append(changed)

    @property
    def count(self) -> int:
        return len(self.generations)


@contextlib.asynccontextmanager
async def running(watch: KubeletSocketWatch) -> AsyncIterator[asyncio.Task[None]]:
    """``watch.run()`` as a task, cancelled (and awaited) afterwards."""
    task = asyncio.create_task(watch.run())
    try:
        yield task
    finally:
        await cancelled(task)


async def cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait (bounded) until it has ended."""
    task.cancel()
    await asyncio.wait({task}, timeout=WITHIN)
    assert task.done(), "run() did not end when cancelled"
    assert task.cancelled(), f"run() ended otherwise than cancelled: {task}"


async def started(watch: KubeletSocketWatch) -> Calls:
    """Subscribe a counter and wait for run()'s first refresh (the inotify watch is in place then)."""
    calls = Calls(watch)
    watch.subscribe(calls)
    await eventually(lambda: calls.count >= 1, "run() refreshed once")
    return calls


# file_identity


def test_file_identity_is_device_inode_and_ctime_of_the_file(plugin_dir: Path) -> None:
    path = plugin_dir / "kubelet.sock"
    path.write_bytes(b"")
    st = os.stat(path)

    assert file_identity(path) == (st.st_dev, st.st_ino, st.st_ctime_ns)


def test_file_identity_is_none_when_nothing_is_there(plugin_dir: Path) -> None:
    assert file_identity(plugin_dir / "kubelet.sock") is None


def test_file_identity_is_of_a_symlink_itself_not_its_target(plugin_dir: Path) -> None:
    target = plugin_dir / "target"
    target.write_bytes(b"")
    link = plugin_dir / "kubelet.sock"
    link.symlink_to(target)
    dangling = plugin_dir / "dangling"
    dangling.symlink_to(plugin_dir / "nothing")

    assert file_identity(link) == identity_of(link)
    assert file_identity(link) != identity_of(target)
    assert file_identity(dangling) is not None


# the state at start


def test_absent_at_start_is_no_inode_and_generation_zero(plugin_dir: Path) -> None:
    watch = KubeletSocketWatch(plugin_dir)

    assert watch.kubelet_socket == plugin_dir / "kubelet.sock"
    assert watch.inode is None
    assert watch.identity is None
    assert watch.generation == 0


def test_present_at_start_is_its_inode_and_generation_one(plugin_dir: Path, kubelet: Kubelet) -> None:
    inode = kubelet.start()

    watch = KubeletSocketWatch(plugin_dir)

    assert watch.inode == inode
    assert watch.identity == identity_of(kubelet.path)
    assert watch.generation == 1


async def test_wait_present_returns_at_once_when_the_socket_is_there(
    plugin_dir: Path, kubelet: Kubelet
) -> None:
    inode = kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)

    assert await asyncio.wait_for(watch.wait_present(), WITHIN) == inode


# following the dir with run()


async def test_wait_present_returns_once_the_socket_appears(plugin_dir: Path, kubelet: Kubelet) -> None:
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch):
        await started(watch)
        waiter = asyncio.create_task(watch.wait_present())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiter.done()  # nothing there yet

        inode = kubelet.start()

        assert await asyncio.wait_for(waiter, WITHIN) == inode
        assert watch.inode == inode
        assert watch.identity == identity_of(kubelet.path)
        assert watch.generation == 1


async def test_a_restarted_kubelet_is_followed_through_its_removal_and_its_new_file(
    plugin_dir: Path, kubelet: Kubelet
) -> None:
    first = kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch):
        calls = await started(watch)
        assert watch.generation == 1

        kubelet.stop()
        await eventually(lambda: watch.inode is None, "the removal is seen")
        assert watch.generation == 2
        assert watch.identity is None

        second = kubelet.start()
        await eventually(lambda: watch.inode == second, "the new file is seen")
        assert second != first
        assert watch.generation == 3
        assert watch.identity == identity_of(kubelet.path)
        assert await asyncio.wait_for(watch.wait_present(), WITHIN) == second
        # the subscriber was told of both changes, with the generation already bumped
        await eventually(lambda: calls.generations[-1] == 3, "the subscriber is told")
        assert 2 in calls.generations


async def test_a_change_to_another_file_in_the_dir_tells_subscribers_without_a_new_generation(
    plugin_dir: Path, kubelet: Kubelet
) -> None:
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch):
        calls = await started(watch)
        before = calls.count

        (plugin_dir / "devicehost-x.sock").write_bytes(b"")

        await eventually(
            lambda: "devicehost-x.sock" in calls.names[before:], "the subscriber is told its name"
        )
        assert watch.generation == 1


async def test_a_failing_subscriber_does_not_end_the_watch(
    plugin_dir: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.05)
    watch = KubeletSocketWatch(plugin_dir)
    failures = 0

    def failing(changed: str | None) -> None:
        nonlocal failures
        failures += 1
        raise RuntimeError("a subscriber's bug")

    watch.subscribe(failing)
    async with running(watch) as task:
        await eventually(lambda: failures >= 1, "the failing subscriber is called")
        watch.unsubscribe(failing)
        calls = Calls(watch)
        watch.subscribe(calls)

        inode = kubelet.start()

        await eventually(lambda: watch.inode == inode, "the socket is still followed")
        await eventually(lambda: calls.count >= 1, "the other subscriber is told")
        assert not task.done()


# refresh(): one generation per file


def test_a_new_file_bumps_the_generation_once_and_tells_subscribers(
    plugin_dir: Path, kubelet: Kubelet
) -> None:
    first = kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    calls = Calls(watch)
    watch.subscribe(calls)

    second = kubelet.restart()  # removed and created again before the watch looks
    watch.refresh()

    assert second != first
    assert watch.inode == second
    assert watch.identity == identity_of(kubelet.path)
    assert watch.generation == 2
    assert calls.generations == [2]


def test_a_late_refresh_for_the_same_file_bumps_nothing(plugin_dir: Path, kubelet: Kubelet) -> None:
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    second = kubelet.restart()
    watch.refresh()
    assert watch.generation == 2
    calls = Calls(watch)
    watch.subscribe(calls)

    watch.refresh()  # a late or duplicate event for the file already seen
    watch.refresh()

    assert watch.generation == 2
    assert watch.inode == second
    assert calls.generations == [2, 2]  # still told: any change in the dir is news to them


def test_a_reused_inode_number_with_a_new_ctime_is_a_new_file(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    identities = iter([(1, 42, 1000), (1, 42, 2000)])
    monkeypatch.setattr(socket_watch, "file_identity", lambda path: next(identities))
    watch = KubeletSocketWatch(plugin_dir)
    assert (watch.generation, watch.inode) == (1, 42)

    watch.refresh()

    assert watch.generation == 2
    assert watch.inode == 42
    assert watch.identity == (1, 42, 2000)


def test_the_removal_itself_is_a_generation_and_clears_presence(plugin_dir: Path, kubelet: Kubelet) -> None:
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)

    kubelet.stop()
    watch.refresh()

    assert watch.inode is None
    assert watch.identity is None
    assert watch.generation == 2


async def test_wait_present_waits_again_after_the_socket_goes(plugin_dir: Path, kubelet: Kubelet) -> None:
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    kubelet.stop()
    watch.refresh()

    waiter = asyncio.create_task(watch.wait_present())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiter.done()

    inode = kubelet.start()
    watch.refresh()

    assert await asyncio.wait_for(waiter, WITHIN) == inode


# subscribers


def test_unsubscribe_stops_the_calls(plugin_dir: Path, kubelet: Kubelet) -> None:
    watch = KubeletSocketWatch(plugin_dir)
    kept, dropped = Calls(watch), Calls(watch)
    watch.subscribe(kept)
    watch.subscribe(dropped)
    watch.refresh()
    assert (kept.count, dropped.count) == (1, 1)

    watch.unsubscribe(dropped)
    kubelet.start()
    watch.refresh()

    assert (kept.count, dropped.count) == (2, 1)
    watch.unsubscribe(dropped)  # a second unsubscribe is harmless
    watch.unsubscribe(lambda: None)  # and so is one for a callback never subscribed


def test_a_subscriber_may_unsubscribe_itself_while_being_called(plugin_dir: Path) -> None:
    watch = KubeletSocketWatch(plugin_dir)
    others = Calls(watch)
    seen = 0

    def once(changed: str | None) -> None:
        nonlocal seen
        seen += 1
        watch.unsubscribe(once)

    watch.subscribe(once)
    watch.subscribe(others)
    watch.refresh()
    watch.refresh()

    assert seen == 1
    assert others.count == 2


async def test_unsubscribe_stops_the_calls_while_running(plugin_dir: Path, kubelet: Kubelet) -> None:
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch):
        dropped = await started(watch)
        watch.unsubscribe(dropped)
        kept = Calls(watch)
        watch.subscribe(kept)
        before = dropped.count

        inode = kubelet.start()
        await eventually(lambda: watch.inode == inode, "the socket is seen")
        await eventually(lambda: kept.count >= 1, "the kept subscriber is told")

        assert dropped.count == before


# the dir deleted and recreated


class SpyInotify(Inotify):
    """The real Inotify, counting the watches it could add."""

    watches_added = 0

    def add_watch(self, path: Path, mask: Mask) -> Watch:
        watch = super().add_watch(path, mask)
        SpyInotify.watches_added += 1
        return watch


async def test_a_busy_dir_still_gets_the_periodic_look(
    plugin_dir: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subscribers whose files live elsewhere (the plugin-watcher sockets) rely on the look that
    names no file; events arriving faster than POLL_INTERVAL must not put it off for ever."""
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.2)
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch):
        calls = await started(watch)
        before = len(calls.names)
        for n in range(60):  # an event every 20 ms for 1.2 s
            (plugin_dir / f"other-{n % 2}.sock").write_bytes(b"")
            (plugin_dir / f"other-{n % 2}.sock").unlink()
            await asyncio.sleep(0.02)
        looks = [name for name in calls.names[before:] if name is None]
        assert len(looks) >= 3, f"{len(looks)} periodic looks in 1.2 s of events with a 0.2 s interval"


async def test_the_dir_deleted_and_recreated_is_watched_again(
    plugin_dir: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.05)
    monkeypatch.setattr(socket_watch, "Inotify", SpyInotify)
    monkeypatch.setattr(SpyInotify, "watches_added", 0)
    kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch) as task:
        calls = await started(watch)
        assert SpyInotify.watches_added == 1

        # The kubelet goes with its dir. (Its listener is closed first: a bound unix socket
        # keeps the dir's dentry alive, and the kernel sends DELETE_SELF only once it goes.)
        kubelet.close()
        shutil.rmtree(plugin_dir)
        await eventually(lambda: watch.inode is None, "the removal is seen")
        removed_at = calls.count
        # while the dir is gone the watch polls (and keeps telling the subscribers)
        await eventually(lambda: calls.count >= removed_at + 2, "the watch polls")
        assert SpyInotify.watches_added == 1
        assert not task.done()

        plugin_dir.mkdir()
        await eventually(lambda: SpyInotify.watches_added == 2, "the recreated dir is watched")

        # From here on only inotify may see a change: the next poll re-arms with an hour.
        monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 3600.0)
        rearmed_at = calls.count
        await eventually(lambda: calls.count > rearmed_at, "the short poll ran out once more")

        second = kubelet.start()
        await eventually(lambda: watch.inode == second, "the new kubelet.sock is seen through inotify")
        assert watch.identity == identity_of(kubelet.path)
        assert watch.generation == 3
        assert not task.done()


async def test_a_new_kubelet_sock_in_a_recreated_dir_is_seen_while_an_old_listener_lives(
    plugin_dir: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket still bound in the deleted dir holds back DELETE_SELF: the poll still sees the new file."""
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.05)
    first = kubelet.start()
    watch = KubeletSocketWatch(plugin_dir)
    async with running(watch) as task:
        await started(watch)

        shutil.rmtree(plugin_dir)  # the old listener stays open
        await eventually(lambda: watch.inode is None, "the removal is seen")
        plugin_dir.mkdir()
        second = kubelet.start()

        await eventually(lambda: watch.inode == second, "the new kubelet.sock is seen")
        assert second != first
        assert watch.generation == 3
        assert not task.done()


async def test_a_dir_missing_at_start_is_polled_for(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.05)
    directory = short_tmp / "later"
    watch = KubeletSocketWatch(directory)
    assert (watch.inode, watch.generation) == (None, 0)
    kubelet = Kubelet(directory)
    try:
        async with running(watch) as task:
            calls = await started(watch)
            await eventually(lambda: calls.count >= 3, "the watch polls")

            directory.mkdir()
            inode = kubelet.start()

            assert await asyncio.wait_for(watch.wait_present(), WITHIN) == inode
            assert watch.generation == 1
            assert not task.done()
    finally:
        kubelet.close()


# cancelling run()


async def test_cancelling_run_ends_it_and_closes_its_inotify(plugin_dir: Path, kubelet: Kubelet) -> None:
    kubelet.start()
    before = inotify_fds()
    watch = KubeletSocketWatch(plugin_dir)
    task = asyncio.create_task(watch.run())
    await started(watch)
    assert inotify_fds() == before + 1

    await cancelled(task)

    with pytest.raises(asyncio.CancelledError):
        await task
    assert inotify_fds() == before


async def test_cancelling_run_while_it_polls_ends_it(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_watch, "POLL_INTERVAL", 0.05)
    before = inotify_fds()
    watch = KubeletSocketWatch(short_tmp / "missing")
    task = asyncio.create_task(watch.run())
    calls = await started(watch)
    await eventually(lambda: calls.count >= 2, "the watch polls")

    await cancelled(task)

    with pytest.raises(asyncio.CancelledError):
        await task
    assert inotify_fds() == before
