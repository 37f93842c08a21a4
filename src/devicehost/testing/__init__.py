"""The test kit for backend authors: the real host, a kubelet stand-in, and a pytest plugin.

Import what your tests type against from here::

    from devicehost.testing import Host, KubeletStandIn

What it holds:

- :class:`KubeletStandIn` and what it reports (:class:`ResourceView`, :class:`AllocationResult`,
  :class:`EventKind`, :class:`AdmissionError`): a kubelet you can run, from
  :mod:`devicehost.standin`.
- :class:`Host`, the real host, and two ways to run it in a test: :func:`running_host` (in this
  process) and :func:`host_process` (a ``devicehost run`` child, a :class:`HostProcess`);
  :class:`BackendLoadError` when a backend named for them does not load.
- ``devicehost.testing.plugin``: the pytest plugin with the ``kubelet``, ``host`` and
  ``start_host`` fixtures, loaded by pytest wherever the kit is installed (a ``pytest11`` entry
  point; ``-p devicehost.testing.plugin`` still works).
- ``devicehost.testing.conformance``: the conformance suite
  (``pytest --pyargs devicehost.testing.conformance --devicehost-backend NAME``; its DRA
  rules with ``--devicehost-dra``).

Which modules import pytest: ``plugin``, ``conformance``, ``conformance_support`` and
``conformance_dra`` do, and are loaded only by pytest. This package itself, ``host`` and ``kubelet`` (the stand-in's old
address, kept for tests written against it) do not, so importing :mod:`devicehost.testing`
works without pytest installed. The kit imports the host and the stand-in (on first use of a
name, so loading the plugin costs nothing); neither imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devicehost.host.daemon import Host
    from devicehost.standin import AdmissionError, AllocationResult, EventKind, KubeletStandIn, ResourceView
    from devicehost.testing.host import BackendLoadError, HostProcess, host_process, running_host

# Imported on first use: pytest loads devicehost.testing.plugin (and so this package) into every
# session of an environment that has the kit, and the host and gRPC cost a second to import.
_HOMES = {
    "Host": "devicehost.host.daemon",
    "AdmissionError": "devicehost.standin",
    "AllocationResult": "devicehost.standin",
    "EventKind": "devicehost.standin",
    "KubeletStandIn": "devicehost.standin",
    "ResourceView": "devicehost.standin",
    "BackendLoadError": "devicehost.testing.host",
    "HostProcess": "devicehost.testing.host",
    "host_process": "devicehost.testing.host",
    "running_host": "devicehost.testing.host",
}

__all__ = [
    "AdmissionError",
    "AllocationResult",
    "BackendLoadError",
    "EventKind",
    "Host",
    "HostProcess",
    "KubeletStandIn",
    "ResourceView",
    "host_process",
    "running_host",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
