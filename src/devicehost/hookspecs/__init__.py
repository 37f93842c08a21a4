"""The vendor contract: hook specifications, the data types they exchange, the kubelet's rules.

A backend imports from here (or from :mod:`devicehost`) and nothing else of the host.
"""

import pluggy

from devicehost.hookspecs.spec import PROJECT_NAME, REQUIRED_HOOKS
from devicehost.hookspecs.types import (
    Api,
    Capacity,
    ClaimRequest,
    ContainerAllocation,
    Device,
    DeviceCondition,
    DeviceSpec,
    DeviceStatus,
    Health,
    HookTimeouts,
    HostFacts,
    Mount,
    NetworkData,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
    Share,
    TaintEffect,
    Version,
)

ENTRY_POINT_GROUP = "devicehost.backends"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a backend's hook implementations: ``@devicehost.hookimpl``."""

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "REQUIRED_HOOKS",
    "Api",
    "Capacity",
    "ClaimRequest",
    "ContainerAllocation",
    "Device",
    "DeviceCondition",
    "DeviceSpec",
    "DeviceStatus",
    "Health",
    "HookTimeouts",
    "HostFacts",
    "Mount",
    "NetworkData",
    "PreferredAllocationRequest",
    "Resource",
    "ResourceNotifier",
    "Share",
    "TaintEffect",
    "Version",
    "hookimpl",
]
