"""The daemon: loads backends, serves each resource on its own socket, keeps it registered.

Start at :mod:`devicehost.host.daemon` (the Host) and :mod:`devicehost.host.resource` (one
resource's socket, server and re-register loop); :mod:`devicehost.host.cli` is the command line.
"""
