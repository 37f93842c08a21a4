"""StreamSet: the open ListAndWatch streams of one resource and their registration epochs."""

from __future__ import annotations

import asyncio
import time

import pytest
from servingfakes import KubeletStream, settle
from waiting import eventually

from devicehost.hookspecs.types import Device
from devicehost.host.serving import streams as streams_module
from devicehost.host.serving.streams import StreamSet
from devicehost.host.serving.table import DeviceTable


@pytest.fixture
def table() -> DeviceTable:
    return DeviceTable([Device("d0"), Device("d1")])


@pytest.fixture
def lost() -> list[int]:
    return []


@pytest.fixture
def streams(table: DeviceTable, lost: list[int]) -> StreamSet:
    return StreamSet(table, lost.append)


def test_open_counts_the_streams(streams: StreamSet) -> None:
    assert streams.count == 0
    with streams.open():
        assert streams.count == 1
        with streams.open():
            assert streams.count == 2
        assert streams.count == 1
    assert streams.count == 0


def test_a_stream_belongs_to_the_epoch_it_was_opened_in(streams: StreamSet) -> None:
    assert streams.epoch == 0
    with streams.open() as first:
        streams.new_epoch()
        assert streams.epoch == 1
        with streams.open() as second:
            assert (first.epoch, second.epoch) == (0, 1)
        streams.new_epoch()
        assert first.epoch == 0
    assert streams.epoch == 2


def test_a_stream_ended_by_the_kubelet_is_lost_with_its_epoch(streams: StreamSet, lost: list[int]) -> None:
    with streams.open() as stream:
        streams.new_epoch()
        streams.new_epoch()
        assert not stream.done.is_set()
    assert lost == [0]
    assert stream.done.is_set()

    with streams.open():
        pass
    assert lost == [0, 2]


def test_a_stream_that_fails_is_lost(streams: StreamSet, lost: list[int]) -> None:
    with pytest.raises(RuntimeError, match="write failed"), streams.open():
        raise RuntimeError("write failed")
    assert lost == [0]
    assert streams.count == 0


async def test_a_cancelled_stream_is_lost(streams: StreamSet, table: DeviceTable, lost: list[int]) -> None:
    stream = KubeletStream(streams, table)
    await stream.opened.wait()
    stream.task.cancel()
    await asyncio.gather(stream.task, return_exceptions=True)
    assert lost == [0]
    assert streams.count == 0


async def test_end_all_ends_every_stream_and_waits_for_them(
    streams: StreamSet, table: DeviceTable, lost: list[int]
) -> None:
    open_streams = [KubeletStream(streams, table) for _ in range(3)]
    for stream in open_streams:
        await stream.opened.wait()
    assert streams.count == 3

    await streams.end_all()

    assert streams.count == 0
    assert [s.ended_by_host for s in open_streams] == [True, True, True]
    assert lost == []  # ended by the host: not lost
    await asyncio.gather(*(s.task for s in open_streams))


async def test_end_all_returns_as_soon_as_the_streams_have_ended(
    streams: StreamSet, table: DeviceTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams_module, "END_WAIT", 60.0)
    stream = KubeletStream(streams, table)
    await stream.opened.wait()
    async with asyncio.timeout(1.0):
        await streams.end_all()
    assert stream.ended_by_host is True


async def test_end_all_with_no_streams_returns_at_once(
    streams: StreamSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams_module, "END_WAIT", 60.0)
    async with asyncio.timeout(1.0):
        await streams.end_all()


async def test_end_all_waits_at_most_end_wait_for_a_stuck_stream(
    streams: StreamSet, lost: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams_module, "END_WAIT", 0.05)
    release = asyncio.Event()
    opened = asyncio.Event()

    async def stuck() -> None:  # blocked elsewhere (a write the kubelet does not read)
        with streams.open():
            opened.set()
            await release.wait()

    task = asyncio.create_task(stuck())
    await opened.wait()
    started = time.monotonic()
    async with asyncio.timeout(1.0):
        await streams.end_all()
    assert time.monotonic() - started >= 0.05 - 0.002
    assert streams.count == 1  # still open

    release.set()
    await task
    assert streams.count == 0
    assert lost == []  # it was ended by the host, however late it noticed


async def test_streams_opened_after_end_all_are_not_ending(streams: StreamSet, table: DeviceTable) -> None:
    old = KubeletStream(streams, table)
    await old.opened.wait()
    await streams.end_all()
    streams.new_epoch()

    new = KubeletStream(streams, table)
    await new.opened.wait()
    await settle()
    assert not new.ended
    assert new.epoch == 1
    assert streams.count == 1

    await streams.end_all()
    await eventually(lambda: new.ended)


async def test_end_all_wakes_streams_without_changing_the_table(
    streams: StreamSet, table: DeviceTable
) -> None:
    stream = KubeletStream(streams, table)
    await stream.opened.wait()
    version = table.version
    await streams.end_all()
    assert table.version == version
    assert stream.ended_by_host is True
