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
  ``start_host`` fixtures (``pytest -p devicehost.testing.plugin``).
- ``devicehost.testing.conformance``: the conformance suite
  (``pytest -p devicehost.testing.plugin --pyargs devicehost.testing.conformance``; its DRA
  rules with ``--devicehost-dra``).

Which modules import pytest: ``plugin``, ``conformance``, ``conformance_support`` and
``conformance_dra`` do, and are loaded only by pytest. This package itself, ``host`` and ``kubelet`` (the stand-in's old
address, kept for tests written against it) do not, so importing :mod:`devicehost.testing`
works without pytest installed. The kit imports the host and the stand-in; neither imports it.
"""

from devicehost.host.daemon import Host
from devicehost.standin import AdmissionError, AllocationResult, EventKind, KubeletStandIn, ResourceView
from devicehost.testing.host import BackendLoadError, HostProcess, host_process, running_host

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
