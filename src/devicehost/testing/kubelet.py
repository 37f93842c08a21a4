"""The kubelet stand-in's old address: it lives in :mod:`devicehost.standin` now.

Kept so that tests written against ``devicehost.testing.kubelet`` keep working; new code imports
from :mod:`devicehost.testing` or :mod:`devicehost.standin`.
"""

from devicehost.standin import (
    AdmissionError,
    AllocationResult,
    DeviceView,
    Event,
    EventKind,
    KubeletStandIn,
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
