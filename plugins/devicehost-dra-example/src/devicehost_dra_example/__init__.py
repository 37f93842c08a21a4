"""devicehost-dra-example: the Go reference DRA driver's GPU profile, as one devicehost backend.

kubernetes-sigs/dra-example-driver publishes mock GPUs under the driver and DeviceClass
``gpu.example.com`` and hands each container environment variables that say which GPU it got
and how it is shared. This backend does the same on devicehost's public API alone: it discovers
the GPUs (served through DRA by default), declares the claim configuration model
(:class:`~devicehost_dra_example.config.GpuConfig`), and turns each claim request into the
environment the reference's e2e suite checks. The host does the rest: ResourceSlices, the
kubelet plugin, CDI specs, the checkpoint, admin access and prioritized lists.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import uuid

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

import devicehost
from devicehost import ClaimRequest, ContainerAllocation, Device, Resource, Version
from devicehost_dra_example.config import DEFAULT, GpuConfig

DRIVER = "gpu.example.com"
RESOURCE = f"{DRIVER}/gpu"
MODEL = "LATEST-GPU-MODEL"
DRIVER_VERSION = Version("1.0.0")
MEMORY = "80Gi"
COMPUTE = 100


class Settings(BaseModel):
    """``backends.dra-example`` in the host config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_gpus: NonNegativeInt = Field(
        default=8, description="mock GPUs on this node (the reference's --num-devices)"
    )
    node_name: str | None = Field(
        default=None, description="seeds the GPUs' UUIDs; unset: $DEVICEHOST_NODE_NAME, else the host name"
    )


def gpu_uuids(seed: str, count: int) -> list[str]:
    """``gpu-<uuid>`` for each GPU, the same on every start for the same node."""
    rng = random.Random(seed)
    return [f"gpu-{uuid.UUID(bytes=rng.randbytes(16))}" for _ in range(count)]


def gpu_env(device: str, config: GpuConfig) -> dict[str, str]:
    """The reference's per-device environment: which GPU, its sharing strategy and its setting."""
    key = f"GPU_DEVICE_{device.removeprefix('gpu-').upper().replace('-', '_')}"
    prop, value = config.sharing.setting()
    return {key: device, f"{key}_SHARING_STRATEGY": config.sharing.strategy, f"{key}_{prop}": value}


class DraExampleBackend:
    """``num_gpus`` mock GPUs ``gpu-0`` .. ``gpu-<n-1>`` with the reference's attributes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings = Settings()

    @devicehost.hookimpl
    def devicehost_settings_model(self) -> type[Settings]:
        return Settings

    @devicehost.hookimpl
    def devicehost_claim_config_model(self) -> type[GpuConfig]:
        return GpuConfig

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Settings) -> None:
        with self._lock:
            self._settings = settings

    def _node(self) -> str:
        return self._settings.node_name or os.environ.get("DEVICEHOST_NODE_NAME") or socket.gethostname()

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            count, seed = self._settings.num_gpus, self._node()
        devices = tuple(
            Device(
                f"gpu-{i}",
                attributes={"index": i, "uuid": gpu_uuid, "model": MODEL, "driverVersion": DRIVER_VERSION},
                capacity={"memory": MEMORY, "compute": COMPUTE},
            )
            for i, gpu_uuid in enumerate(gpu_uuids(seed, count))
        )
        return [Resource(RESOURCE, devices, serve_through="dra")]

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> ContainerAllocation:
        with self._lock:
            count, node = self._settings.num_gpus, self._node()
        unknown = sorted(set(device_ids) - {f"gpu-{i}" for i in range(count)})
        if resource != RESOURCE or unknown:
            raise ValueError(f"no such GPU in {resource}: {', '.join(unknown) or device_ids}")
        config = claim.config if claim is not None and claim.config is not None else DEFAULT
        envs = {"KUBERNETES_NODE_NAME": node, "DRA_RESOURCE_DRIVER_NAME": DRIVER}
        for device in device_ids:
            envs |= gpu_env(device, config)
        if claim is not None:
            envs["DRA_ADMIN_ACCESS"] = "true" if claim.admin_access else "false"
            for device in device_ids:
                key = device.removeprefix("gpu-").upper().replace("-", "_")
                envs[f"GPU_DEVICE_{key}_RESOURCE_CLAIM"] = claim.uid
        return ContainerAllocation(envs=envs)
