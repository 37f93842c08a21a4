"""A kubelet you can run: the device manager's side of the device plugin protocol, over grpc.aio,
and the DRA manager's side of Dynamic Resource Allocation.

Product code, not a test double: ``devicehost run --simulate-kubelet`` serves backends to it on
a machine with no Kubernetes, and :mod:`devicehost.testing` drives it in tests and in the
conformance suite. Start with :class:`KubeletStandIn`.

Its parts, one concern each: ``kubelet.py`` (the stand-in: lifecycle, ``kubelet.sock`` and the
plugin watcher put together), ``registration.py`` (``kubelet.sock`` and the Register checks),
``plugin_watcher.py`` (the kubelet's ``plugins_registry`` path), ``dra.py`` (DRA drivers registered
there, and the prepare and unprepare calls to them), ``connection.py`` (the kubelet's
client of one plugin socket), ``device_manager.py`` (the calls tests use to read and drive it),
``registry.py`` (the records of resources), ``events.py`` (events and waits), ``admission.py``
(allocating devices to a container) and ``model.py`` (what it reports). It imports nothing from
:mod:`devicehost.host` or :mod:`devicehost.testing`.
"""

from devicehost.standin.kubelet import KubeletStandIn
from devicehost.standin.model import (
    AdmissionError,
    AllocationResult,
    DeviceView,
    DraCallError,
    DraDevice,
    Event,
    EventKind,
    ListRecord,
    ResourceView,
)

__all__ = [
    "AdmissionError",
    "AllocationResult",
    "DeviceView",
    "DraCallError",
    "DraDevice",
    "Event",
    "EventKind",
    "KubeletStandIn",
    "ListRecord",
    "ResourceView",
]
