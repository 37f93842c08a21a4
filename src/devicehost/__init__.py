"""devicehost: one host process for Kubernetes device plugins.

Backends import the contract from here::

    import devicehost

    @devicehost.hookimpl
    def devicehost_discover():
        return [devicehost.Resource("example.com/widget", (devicehost.Device("w0"),))]
"""

from devicehost import cdi, policies, quantity
from devicehost.hookspecs import (
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
    hookimpl,
)


def __getattr__(name: str) -> str:
    """``__version__``: the installed distribution's version (setup.cfg is the one source).

    Read on first use, not at import: every backend imports this package, and the metadata
    lookup would add to the host's start before its first registration.
    """
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("devicehost")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
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
    "__version__",
    "cdi",
    "hookimpl",
    "policies",
    "quantity",
]
