"""devicehost-nvidia: NVIDIA GPUs through NVML, as the ``nvidia`` devicehost backend."""

from devicehost_nvidia.backend import NvidiaBackend

__all__ = ["NvidiaBackend"]
