"""The daemon. Nothing under ``devicehost.host`` is API: backends import :mod:`devicehost`,
:mod:`devicehost.cdi` and :mod:`devicehost.testing` only.

docs/architecture.md maps the rooms: :mod:`~devicehost.host.cli` (the command line),
:mod:`~devicehost.host.app` (the process: signals, probes, watches, teardown),
:mod:`~devicehost.host.daemon` (the Host: backends, resources, discovery rounds, reloads),
``serving/`` (one resource: socket, servicer, streams, registrar), ``kubelet/`` (kubelet.sock
and Register), ``backends/`` (loading and calling backends), ``ops/`` (metrics, probes,
status) and :mod:`~devicehost.host.state` (the snapshots they read).
"""
