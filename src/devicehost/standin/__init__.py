"""A kubelet you can run: the device manager's side of the device plugin protocol, over grpc.aio.

Product code, not a test double: ``devicehost run --simulate-kubelet`` serves backends to it on
a machine with no Kubernetes, and :mod:`devicehost.testing` drives it in tests and in the
conformance suite. Start with :class:`KubeletStandIn`.
"""

from devicehost.standin.kubelet import KubeletStandIn
from devicehost.standin.model import (
    AdmissionError,
    AllocationResult,
    DeviceView,
    Event,
    EventKind,
    ListRecord,
    ResourceView,
)

__all__ = [
    "AdmissionError",
    "AllocationResult",
    "DeviceView",
    "Event",
    "EventKind",
    "KubeletStandIn",
    "ListRecord",
    "ResourceView",
]
