"""Writing a file whole: a synced temporary file beside it, renamed over it, so that a reader (a
container runtime, the next host start) sees the old file or the new one, never half of one; the
rename (and a removal) synced in its directory too, so it outlives a crash of the node.

CDI specs (:mod:`devicehost.cdi`), the DRA checkpoint and the device metadata files are written
this way; a leaf, importing nothing of devicehost.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int | None = None) -> os.stat_result:
    """``text`` as ``path`` (with ``mode`` when given, else the umask's): written and synced to a
    hidden temporary file in ``path``'s dir, then renamed over ``path`` (the rename synced); the
    written file's stat."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
            stat = os.fstat(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)
    return stat


def remove(path: Path) -> None:
    """Remove ``path`` (none there: nothing happens), the removal synced."""
    path.unlink(missing_ok=True)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` survive a crash of the node."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
