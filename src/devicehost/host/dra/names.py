"""How a resource and its devices are named on the DRA side.

DRA names are stricter than device plugin ones: a driver is a DNS subdomain of at most 63
characters, a device a DNS label. A device ID that is not one is mapped to one that is, with
a short hash of the ID so two IDs never share a name; the original ID is published as the
``id`` attribute.

A driver's DRAPlugin socket is ``<plugins dir>/<driver>/devicehost-dra-<token>.sock``; where a
long driver name under a deep plugins dir would pass the unix socket limit, the dir is the
driver's name cut, with a hash of the whole (:func:`driver_dir`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devicehost.host.sockets import (
    HASH_LENGTH,
    MAX_UNIX_PATH,
    PREFIX,
    SUFFIX,
    TOKEN_LENGTH,
    SocketDirError,
    fitted,
)

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_LABEL = 63
MAX_SUBDOMAIN = 253
DRA_SOCKET = "dra"
"""The resource part of a driver's DRAPlugin socket name: ``devicehost-dra-<token>.sock``."""
DRA_SOCKET_NAME = len(f"{PREFIX}{DRA_SOCKET}-{'0' * TOKEN_LENGTH}{SUFFIX}")
DRA_ROOM = HASH_LENGTH + 2 + 1 + DRA_SOCKET_NAME
"""Bytes a DRAPlugin socket's path needs below the plugins dir: the shortest driver dir (one
character and the hash), a ``/`` and the socket's name."""


def driver_name(resource: str, configured: Mapping[str, str]) -> str:
    """The configured driver of ``resource``, else its domain (``example.com/widget`` -> ``example.com``)."""
    return configured.get(resource) or resource.partition("/")[0]


def driver_dir(plugins_dir: Path, driver: str) -> Path:
    """Where ``driver``'s DRAPlugin socket and claims checkpoint go: ``<plugins dir>/<driver>``,
    or the driver's name cut with a hash of it where the socket's path would pass the limit (the
    same dir for every host start).

    :raises SocketDirError: ``plugins_dir`` leaves no room even for the shortest dir.
    """
    room = MAX_UNIX_PATH - len(os.fsencode(plugins_dir)) - 2 - DRA_SOCKET_NAME
    name = fitted(driver, room)
    if name is None:
        raise SocketDirError(f"dra_plugins_dir {plugins_dir} is too long a path for unix sockets")
    return plugins_dir / name


def pool_name(node: str, resource: str) -> str:
    """The pool of ``resource``'s devices on ``node``: ``<node>/<class>`` (one pool per resource)."""
    return f"{node}/{device_name(resource.partition('/')[2])}"


def device_name(device_id: str) -> str:
    """``device_id`` as a DNS label: itself when it is one, else a cleaned form plus a hash."""
    if len(device_id) <= MAX_LABEL and _LABEL.fullmatch(device_id):
        return device_id
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    clean = _NOT_LABEL.sub("-", device_id.lower()).strip("-")[: MAX_LABEL - len(digest) - 1].strip("-")
    return f"{clean}-{digest}" if clean else f"d-{digest}"


def slice_name(node: str, driver: str, resource: str, index: int = 0) -> str:
    """The ``index``-th ResourceSlice of ``resource``'s pool on ``node`` (a DNS subdomain of at
    most 253 characters): ``<node>-<driver>-<class>`` for the first (the name it always had),
    ``<node>-<driver>-<class>-<index>`` for the others. A name too long is cut and given a hash
    of the whole, the index kept at its end."""
    raw = f"{node}-{driver}-{resource.partition('/')[2]}".lower()
    name = re.sub(r"[^a-z0-9.-]+", "-", raw).strip("-.")
    suffix = f"-{index}" if index else ""
    if len(name) + len(suffix) <= MAX_SUBDOMAIN:
        return name + suffix
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{name[: MAX_SUBDOMAIN - 9 - len(suffix)].strip('-.')}-{digest}{suffix}"


def counter_slice_name(node: str, driver: str, resource: str) -> str:
    """The ResourceSlice of ``resource``'s pool that holds its shared counter sets."""
    base = slice_name(node, driver, resource)
    return base + "-counters" if len(base) <= MAX_SUBDOMAIN - 9 else f"{base[: MAX_SUBDOMAIN - 9]}-counters"


def named_slices(
    node: str, driver: str, resource: str, specs: Sequence[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The specs of ``resource``'s pool with their slices' names, first to last: the ``i``-th
    device slice is :func:`slice_name` ``i``, the counter sets' one :func:`counter_slice_name`."""
    return [
        (
            counter_slice_name(node, driver, resource)
            if "sharedCounters" in spec
            else slice_name(node, driver, resource, i),
            spec,
        )
        for i, spec in enumerate(specs)
    ]


def cdi_kind(driver: str, claim_uid: str) -> str:
    """The CDI kind of one claim's spec: names unique per claim, so no runtime cache mixes claims."""
    return f"{driver}/claim-{claim_uid}"


def metadata_kind(driver: str, claim_uid: str) -> str:
    """The CDI kind of one claim's device metadata mounts (KEP-5304), beside its own spec."""
    return f"{driver}/metadata-{claim_uid}"


def cdi_device_name(request: str, resource: str) -> str:
    """The CDI device of one request in a claim's spec: ``<request>.<class>``; a subrequest of a
    prioritized list (``gpu/older``) becomes ``gpu_older`` (request names are DNS labels: no ``_``)."""
    return f"{request.replace('/', '_')}.{device_name(resource.partition('/')[2])}"
