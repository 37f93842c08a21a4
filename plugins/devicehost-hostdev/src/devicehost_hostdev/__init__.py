"""devicehost-hostdev: host device nodes, files and USB devices as extended resources.

Resources come from the host config file (``backends.hostdev``, see :mod:`.config`); every
discovery re-scans the node's ``/dev`` and ``/sys`` (under a configurable root), so devices
appear and disappear as they are plugged in and out.
"""

from devicehost_hostdev.backend import HostdevBackend

__all__ = ["HostdevBackend"]
