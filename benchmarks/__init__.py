"""Benchmarks of the host against a bare grpc.aio servicer: ``python -m benchmarks.run``."""

import os

# gRPC C-core reads GRPC_VERBOSITY once, when grpc is first imported: set here, before any
# benchmark module imports it, so its INFO lines ("Got goaway" at every restart) stay out of
# the table's output, as the host itself keeps them out (devicehost.host.logs.quiet_grpc_core).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
