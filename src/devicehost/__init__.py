"""devicehost: one host process for Kubernetes device plugins.

Backends import the contract from here::

    import devicehost

    @devicehost.hookimpl
    def devicehost_discover():
        return [devicehost.Resource("example.com/widget", (devicehost.Device("w0"),))]
"""

import importlib.metadata

from devicehost.hookspecs import (
    ContainerAllocation,
    Device,
    DeviceSpec,
    Health,
    Mount,
    PreferredAllocationRequest,
    Resource,
    ResourceNotifier,
    hookimpl,
)

__version__ = importlib.metadata.version("devicehost")
"""The installed distribution's version (setup.cfg is the one source)."""

__all__ = [
    "ContainerAllocation",
    "Device",
    "DeviceSpec",
    "Health",
    "Mount",
    "PreferredAllocationRequest",
    "Resource",
    "ResourceNotifier",
    "__version__",
    "hookimpl",
]
