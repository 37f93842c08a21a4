"""The host context: the live configuration every part reads, and the facts backends are told."""

from __future__ import annotations

import asyncio
from pathlib import Path

from devicehost import HostFacts
from devicehost.host.config import HostConfig
from devicehost.host.context import HostContext


def test_the_facts_are_the_same_object_until_a_fact_changes(tmp_path: Path) -> None:
    context = HostContext(HostConfig(node_name="n", cdi_dir=tmp_path / "a"))
    told = context.facts()
    assert told == HostFacts(node_name="n", cdi_dir=tmp_path / "a")
    context.config = context.config.model_copy(update={"health_interval": 1.0})
    assert context.facts() is told  # hook calls compare by identity: nothing to tell
    context.config = context.config.model_copy(update={"cdi_dir": tmp_path / "b"})
    assert context.facts() == HostFacts(node_name="n", cdi_dir=tmp_path / "b")


async def test_a_sleep_follows_a_reload_of_its_setting_at_once() -> None:
    context = HostContext(HostConfig(health_interval=30.0))
    sleeping = asyncio.create_task(context.sleep(lambda config: config.health_interval))
    await asyncio.sleep(0.05)
    assert not sleeping.done()
    context.config = context.config.model_copy(update={"health_interval": 0.01})
    await asyncio.wait_for(sleeping, timeout=2)  # not the 30 s it started with


async def test_a_reload_of_another_setting_leaves_a_sleep_as_long() -> None:
    context = HostContext(HostConfig(health_interval=0.3))
    loop = asyncio.get_running_loop()
    started = loop.time()
    sleeping = asyncio.create_task(context.sleep(lambda config: config.health_interval))
    await asyncio.sleep(0.05)
    context.config = context.config.model_copy(update={"hook_timeout": 1.0})
    await sleeping
    assert loop.time() - started >= 0.3
