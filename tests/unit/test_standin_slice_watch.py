"""The API server stand-in's ResourceSlice watch: the events a real API server's watch sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from devicehost.standin.apiserver import ApiServerStandIn, SliceEvent


def body(name: str, node: str = "n", driver: str = "example.com", version: str = "") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if version:
        metadata["resourceVersion"] = version
    return {"metadata": metadata, "spec": {"nodeName": node, "driver": driver, "devices": []}}


async def next_event(events: AsyncIterator[SliceEvent]) -> tuple[str, str, Mapping[str, Any]]:
    async with asyncio.timeout(2):
        kind, slice_ = await anext(events)
    return kind, slice_["metadata"]["name"], slice_


async def test_a_watch_sees_what_is_there_then_every_change_by_anyone_of_its_node_and_driver() -> None:
    api = ApiServerStandIn()
    await api.create_slice(body("before"))
    events = api.slice_events("n", "example.com")
    assert (await next_event(events))[:2] == ("ADDED", "before")  # a watch from no resourceVersion
    await api.create_slice(body("other-node", node="m"))  # not this watch's
    await api.create_slice(body("other-driver", driver="example.org"))
    stored = await api.create_slice(body("s"))
    assert (await next_event(events))[:2] == ("ADDED", "s")
    changed = body("s", version=stored["metadata"]["resourceVersion"])
    changed["spec"]["devices"] = [{"name": "d0"}]
    await api.replace_slice(changed)  # another client's edit
    kind, name, seen = await next_event(events)
    assert (kind, name, seen["spec"]["devices"]) == ("MODIFIED", "s", [{"name": "d0"}])
    assert seen["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]
    await api.delete_slice("s")
    assert (await next_event(events))[:2] == ("DELETED", "s")
    await events.aclose()  # type: ignore[attr-defined]
