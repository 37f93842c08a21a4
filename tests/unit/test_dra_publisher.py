"""The publisher keeps one driver's ResourceSlices what the host wants, against a fake API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from drafakes import CountingCluster
from hostfakes import captured_logs

from devicehost import Device
from devicehost.host.dra import publisher as publisher_module
from devicehost.host.dra.publisher import Publisher, problem_kind
from devicehost.host.dra.slices import slice_body, slice_spec
from devicehost.testing.cluster import NODE_UID

NODE, DRIVER, SLICE = "node-a", "example.com", "node-a-example.com-widget"


def spec(*ids: str) -> dict[str, Any]:
    return slice_spec(NODE, DRIVER, f"{NODE}/widget", [Device(i) for i in ids])


def want(publisher: Publisher, name: str, spec: dict[str, Any]) -> None:
    """Publish ``spec`` as the slice ``name``, a pool of one slice keyed by its name."""
    publisher.want_pool(name, [(name, spec)])


def generation(cluster: CountingCluster, name: str = SLICE) -> int:
    return int(cluster.stored[name]["spec"]["pool"]["generation"])


def events(logs: list[Any], prefix: str) -> list[Any]:
    return [e for e in logs if e["event"].startswith(prefix)]


async def test_a_wanted_slice_is_created_once_owned_by_the_node() -> None:
    cluster = CountingCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0", "w1"))
    await publisher.sync()
    await publisher.sync()
    assert cluster.calls["create_slice"] == 1
    assert cluster.calls["replace_slice"] == 0
    assert cluster.calls["node_uid"] == 1  # asked once, not on every sync
    assert publisher.written.writes == 1
    stored = cluster.stored[SLICE]
    assert [d["name"] for d in stored["spec"]["devices"]] == ["w0", "w1"]
    assert stored["spec"]["pool"]["generation"] == 1
    assert stored["metadata"]["ownerReferences"][0]["uid"] == NODE_UID


async def test_a_slice_is_replaced_only_when_its_devices_change_one_generation_up() -> None:
    cluster = CountingCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0"))
    await publisher.sync()
    want(publisher, SLICE, spec("w0"))  # the same again: nothing to write
    await publisher.sync()
    assert cluster.calls["replace_slice"] == 0
    want(publisher, SLICE, spec("w0", "w1"))
    await publisher.sync()  # the stand-in refuses a replace without the current resourceVersion
    assert cluster.calls["replace_slice"] == 1
    assert generation(cluster) == 2
    assert [d["name"] for d in cluster.stored[SLICE]["spec"]["devices"]] == ["w0", "w1"]
    await publisher.sync()
    assert cluster.calls["replace_slice"] == 1
    assert publisher.written.writes == 2


async def test_a_slice_changed_by_someone_else_is_replaced_above_its_generation() -> None:
    cluster = CountingCluster()
    theirs = slice_body(
        SLICE, (NODE, NODE_UID), {**spec("x"), "pool": {**spec("x")["pool"], "generation": 7}}
    )
    await cluster.create_slice(theirs)  # left by an earlier host start
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0"))
    await publisher.sync()
    assert cluster.calls["create_slice"] == 1  # the one above only
    assert generation(cluster) == 8


async def test_what_is_not_wanted_is_deleted_and_only_this_drivers_slices_on_this_node() -> None:
    cluster = CountingCluster()
    stale = slice_body("stale", (NODE, NODE_UID), spec("old"))
    other_driver = slice_body("other", (NODE, NODE_UID), {**spec("o"), "driver": "other.org"})
    other_node = slice_body("elsewhere", ("node-b", "u"), {**spec("o"), "nodeName": "node-b"})
    for body in (stale, other_driver, other_node):
        await cluster.create_slice(body)
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0"))
    await publisher.sync()
    assert set(cluster.stored) == {SLICE, "other", "elsewhere"}
    publisher.drop_pool(SLICE)
    await publisher.sync()
    assert set(cluster.stored) == {"other", "elsewhere"}
    assert cluster.calls["delete_slice"] == 2


async def test_a_slice_deleted_from_outside_comes_back_newer_than_before() -> None:
    """Issue 24: it came back with generation 1, older than what the scheduler had seen."""
    cluster = CountingCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0"))
    await publisher.sync()
    want(publisher, SLICE, spec("w0", "w1"))
    await publisher.sync()
    assert generation(cluster) == 2
    cluster.delete(SLICE)  # as the kubelet does when it starts
    await publisher.sync()
    assert generation(cluster) == 3


async def test_nothing_is_compared_or_written_before_the_publisher_is_opened() -> None:
    cluster = CountingCluster()
    cluster.stored["left"] = {"spec": {"nodeName": NODE, "driver": DRIVER, "pool": {"name": "old"}}}
    publisher = Publisher(cluster, NODE, DRIVER)
    running = asyncio.create_task(publisher.run())
    try:
        want(publisher, SLICE, spec("w0"))
        await asyncio.sleep(0.2)
        assert cluster.calls == {}  # not even listed: another instance's slices stay as they are
        publisher.open()  # the kubelet registered the driver
        async with asyncio.timeout(5):
            await publisher.synced()
        assert sorted(cluster.stored) == [SLICE]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_watch_publishes_a_deleted_slice_again_by_itself() -> None:
    cluster = CountingCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    running = asyncio.create_task(publisher.run())
    publisher.open()  # the kubelet registered the driver
    try:
        want(publisher, SLICE, spec("w0"))
        async with asyncio.timeout(5):
            await publisher.synced()
        assert generation(cluster) == 1
        await asyncio.sleep(0.05)  # the watch is up
        cluster.delete(SLICE)
        await cluster.wait(lambda c: SLICE in c.stored)
        assert generation(cluster) == 2
        assert cluster.calls["create_slice"] == 2
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_field_the_api_server_drops_does_not_make_its_own_writes_look_like_edits() -> None:
    """An API server without a feature drops its fields (here device taints): the slice it stores
    differs from the one written, and the watch must not take that for someone else's edit."""
    cluster = CountingCluster()
    tainted = spec("w0")
    tainted["devices"][0]["taints"] = [{"key": "devicehost.io/unhealthy", "effect": "NoSchedule"}]
    publisher = Publisher(cluster, NODE, DRIVER, min_interval=0.2)
    running = asyncio.create_task(publisher.run())
    publisher.open()
    try:
        want(publisher, SLICE, tainted)
        await cluster.wait(lambda c: SLICE in c.stored)
        await asyncio.sleep(1.0)  # five write intervals
        assert cluster.calls["create_slice"] + cluster.calls["replace_slice"] == 1
        assert publisher.written.restored == {}
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_failing_api_server_is_retried_with_backoff_and_logged_once() -> None:
    cluster = CountingCluster()
    cluster.failing["slices"] = "listing ResourceSlices: 500 InternalError: etcd is gone"
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        want(publisher, SLICE, spec("w0"))
        running = asyncio.create_task(publisher.run())
        publisher.open()  # the kubelet registered the driver
        try:
            await asyncio.sleep(1.0)
            tries = cluster.calls["slices"]
            # 0.1-0.2, 0.2-0.4, 0.4-0.8 s apart: at most 4 tries in a second (a spin makes thousands)
            assert 2 <= tries <= 4, tries
            failed = events(logs, "publishing ResourceSlices failed")
            assert len(failed) == 1
            assert failed[0]["error"] == cluster.failing["slices"]
            assert failed[0]["log_level"] == "error"
            assert SLICE not in cluster.stored
            del cluster.failing["slices"]
            async with asyncio.timeout(5):
                await publisher.synced()
            assert generation(cluster) == 1
            assert len(events(logs, "ResourceSlices published again")) == 1
            assert len(events(logs, "publishing ResourceSlices failed")) == 1
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


async def test_a_new_problem_is_logged_again() -> None:
    cluster = CountingCluster()
    cluster.failing["slices"] = "first problem"
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        want(publisher, SLICE, spec("w0"))
        running = asyncio.create_task(publisher.run())
        publisher.open()  # the kubelet registered the driver
        try:
            await asyncio.sleep(0.35)
            cluster.failing["slices"] = "second problem"
            await asyncio.sleep(0.9)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert [e["error"] for e in events(logs, "publishing ResourceSlices failed")] == [
        "first problem",
        "second problem",
    ]


async def test_withdraw_all_deletes_each_slice_once() -> None:
    cluster = CountingCluster()
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        running = asyncio.create_task(publisher.run())
        publisher.open()  # the kubelet registered the driver
        want(publisher, SLICE, spec("w0"))
        want(publisher, "second", spec("w1"))
        async with asyncio.timeout(5):
            await publisher.synced()
        running.cancel()  # as the driver stops: the run first, then the withdrawal
        await asyncio.gather(running, return_exceptions=True)
        await publisher.withdraw_all()
        await publisher.withdraw_all()  # nothing left: nothing deleted again
    assert cluster.stored == {}
    assert cluster.calls["delete_slice"] == 2
    assert sorted(e["slice"] for e in events(logs, "ResourceSlice deleted")) == sorted(["second", SLICE])


async def test_withdraw_all_on_a_failing_api_server_says_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = CountingCluster()
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        want(publisher, SLICE, spec("w0"))
        await publisher.sync()
        cluster.down = "connection refused"
        await publisher.withdraw_all()  # no exception: the host stops anyway
    assert SLICE in cluster.stored
    assert len(events(logs, "ResourceSlices left behind")) == 1


async def test_withdraw_all_gives_up_on_a_hanging_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = CountingCluster()
    publisher = Publisher(cluster, NODE, DRIVER)
    want(publisher, SLICE, spec("w0"))
    await publisher.sync()

    async def hang(node: str, driver: str) -> Any:
        await asyncio.sleep(3600)

    monkeypatch.setattr(cluster, "slices", hang)
    monkeypatch.setattr(publisher_module, "STOP_TIMEOUT", 0.1)
    async with asyncio.timeout(2):
        await publisher.withdraw_all()


async def test_a_bug_in_publishing_is_logged_with_its_traceback_and_retried() -> None:
    """A non-API exception (a value the client cannot encode, say) used to end the publishing
    task silently: no slice, no line."""
    cluster = CountingCluster()
    calls = 0
    real = cluster.create_slice

    async def create(body: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TypeError("Encoding objects of type Version is unsupported")
        return await real(body)

    cluster.create_slice = create  # type: ignore[method-assign]
    with captured_logs() as logs:
        publisher = Publisher(cluster, NODE, DRIVER)
        task = asyncio.create_task(publisher.run())
        publisher.open()  # the kubelet registered the driver
        want(publisher, SLICE, spec("w0"))
        try:
            await cluster.wait(lambda c: SLICE in c.stored, timeout=5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    (failed,) = [e for e in logs if e["event"] == "publishing ResourceSlices failed, retrying with backoff"]
    assert "TypeError" in failed["error"]
    assert failed["exc_info"] is True
    assert calls == 2


def test_a_problem_is_the_same_whatever_resource_versions_it_names() -> None:
    first = problem_kind(
        "watching ResourceSlices: 504 Timeout: Too large resource version: 682, current: 681"
    )
    again = problem_kind(
        "watching ResourceSlices: 504 Timeout: Too large resource version: 683, current: 682"
    )
    assert first == again
    assert problem_kind("a") != problem_kind("b")
