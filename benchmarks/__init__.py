"""Benchmarks of the host against a bare grpc.aio servicer: ``python -m benchmarks.run``."""
