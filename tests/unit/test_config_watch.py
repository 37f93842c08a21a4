"""Following the config file (``host/config_watch.py``): in-place edits, replacements, a
ConfigMap's ``..data`` symlink swap; a touch that changes nothing asks for no reload."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from waiting import eventually

from devicehost.host.config_watch import watch_config_file


async def test_each_real_change_asks_for_one_reload_and_a_touch_for_none(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("rediscover_interval: 10\n")
    changes: list[str] = []
    watching = asyncio.create_task(watch_config_file(path, lambda: changes.append(path.read_text())))
    try:
        await asyncio.sleep(0.1)  # the watch is set
        path.write_text("rediscover_interval: 20\n")  # edited in place
        await eventually(lambda: len(changes) == 1, "the edit")
        os.utime(path)  # touched, same content
        replacement = tmp_path / "config.yaml.new"
        replacement.write_text("rediscover_interval: 30\n")
        os.replace(replacement, path)  # replaced by a rename
        await eventually(lambda: len(changes) == 2, "the replacement")
        await asyncio.sleep(0.2)
        assert changes == ["rediscover_interval: 20\n", "rediscover_interval: 30\n"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_a_configmap_swap_of_its_data_link_is_one_change(tmp_path: Path) -> None:
    """As the kubelet updates a ConfigMap volume: a new timestamped dir, ``..data`` re-pointed."""
    old, new = tmp_path / "..2026_01", tmp_path / "..2026_02"
    old.mkdir()
    (old / "config.yaml").write_text("a: 1\n")
    (tmp_path / "..data").symlink_to(old.name)
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    changes: list[None] = []
    watching = asyncio.create_task(watch_config_file(tmp_path / "config.yaml", lambda: changes.append(None)))
    try:
        await asyncio.sleep(0.1)
        new.mkdir()
        (new / "config.yaml").write_text("a: 2\n")
        (tmp_path / "..data_tmp").symlink_to(new.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        await eventually(lambda: len(changes) == 1, "the swap")
        await asyncio.sleep(0.2)
        assert len(changes) == 1
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
