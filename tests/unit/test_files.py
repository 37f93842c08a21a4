"""devicehost._files: a file is written whole or not at all, and the write (or a removal) outlives
a crash of the node: the file and its directory are synced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devicehost._files import remove, write_atomically


def test_the_file_is_replaced_whole_with_its_mode_and_its_stat_returned(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "spec.json"
    first = write_atomically(path, "one\n", 0o644)
    assert path.read_text() == "one\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert first.st_ino == path.stat().st_ino
    second = write_atomically(path, "two\n")
    assert (path.read_text(), second.st_ino) == ("two\n", path.stat().st_ino)
    assert second.st_ino != first.st_ino  # a new file renamed over the old, not the old rewritten
    assert sorted(p.name for p in path.parent.iterdir()) == ["spec.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    write_atomically(path, "kept\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomically(path, "half \ud800 written\n")
    assert path.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


def test_the_rename_and_a_removal_are_synced_in_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    path = tmp_path / "claims.json"
    write_atomically(path, "{}\n")
    assert synced == ["file", "dir"]  # the data, then the rename
    remove(path)
    remove(path)  # none there: nothing to remove, still synced
    assert (synced[2:], path.exists()) == (["dir", "dir"], False)
    remove(tmp_path / "gone" / "x.json")  # no such dir: nothing happens
    assert len(synced) == 4
