"""Device IDs: short, stable and readable, derived from what a device was matched by."""

from __future__ import annotations

import hashlib
import re

from devicehost.hookspecs.rules import MAX_DEVICE_ID_LENGTH

HASH_LENGTH = 8
_LOSSLESS = re.compile(r"[A-Za-z0-9.-]+(/[A-Za-z0-9.-]+)*")
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def device_id(source: str, max_length: int = MAX_DEVICE_ID_LENGTH) -> str:
    """``/dev/ttyUSB0`` -> ``ttyUSB0``, ``/dev/net/tun`` -> ``net_tun``.

    The source loses a leading ``/dev/`` (or ``/``) and its ``/`` become ``_``. When that is not
    reversible (the source holds ``_`` or characters outside ``[A-Za-z0-9.-]``) or longer than
    ``max_length``, the readable part is cut short and a hash of the whole source is appended, so
    two sources never share an ID: ``/dev/vhost_net`` -> ``vhost_net-<8 hex digits>``.
    """
    text = source.removeprefix("/dev/").strip("/")
    if _LOSSLESS.fullmatch(text) and len(text) <= max_length:
        return text.replace("/", "_")
    digest = hashlib.sha256(source.encode()).hexdigest()[:HASH_LENGTH]
    head = _UNSAFE.sub("_", text).strip("_-")[: max_length - HASH_LENGTH - 1].rstrip("_-")
    return f"{head}-{digest}" if head else digest


def replica_ids(source: str, count: int) -> list[str]:
    """The ``count`` IDs of one device shared by several containers: ``<id>-0`` ... ``<id>-<count-1>``.

    A device that is not shared (``count`` 1) keeps the plain ID.
    """
    if count == 1:
        return [device_id(source)]
    suffix_length = len(f"-{count - 1}")
    base = device_id(source, MAX_DEVICE_ID_LENGTH - suffix_length)
    return [f"{base}-{n}" for n in range(count)]
