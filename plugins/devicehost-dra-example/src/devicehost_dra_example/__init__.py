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

import threading

from pydantic import ConfigDict, Field, NonNegativeInt

import devicehost
from devicehost import Capacity, ClaimRequest, ContainerAllocation, Device, DeviceStatus, Resource, Version
from devicehost_dra_example.binding import BindingSettings, binding_fields, device_status
from devicehost_dra_example.config import DEFAULT, GpuConfig
from devicehost_dra_example.node import node_name, seeded_uuids

DRIVER = "gpu.example.com"
RESOURCE = f"{DRIVER}/gpu"
MODEL = "LATEST-GPU-MODEL"
DRIVER_VERSION = Version("1.0.0")
MEMORY_GI = 80
COMPUTE = 100
GI = 2**30


class Settings(BindingSettings):
    """``backends.dra-example`` in the host config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_gpus: NonNegativeInt = Field(
        default=8, description="mock GPUs on this node (the reference's --num-devices)"
    )
    gpu_partitions: NonNegativeInt = Field(
        default=0,
        description="partitions per GPU (the reference's --gpu-partitions): each GPU becomes a counter "
        "set of its memory and compute, published as that many partitions and one full device drawing on it",
    )
    gpu_allow_multiple_allocations: bool = Field(
        default=False,
        description="many claims share each GPU (the reference's gpuAllowMultipleAllocations): each takes "
        "the memory and compute it asks for (whole GPU by default, 1Gi and 1 steps)",
    )
    node_name: str | None = Field(
        default=None, description="seeds the GPUs' UUIDs; unset: the node the host names, else the host name"
    )


def gpu_env(device: str, config: GpuConfig) -> dict[str, str]:
    """The reference's per-device environment: which GPU, its sharing strategy and its setting."""
    key = f"GPU_DEVICE_{device.removeprefix('gpu-').upper().replace('-', '_')}"
    prop, value = config.sharing.setting()
    return {key: device, f"{key}_SHARING_STRATEGY": config.sharing.strategy, f"{key}_{prop}": value}


def gpus(settings: Settings, seed: str) -> Resource:
    """The GPUs as the reference's GPU profile enumerates them: whole GPUs, or with
    ``gpu_partitions`` each GPU's partitions and its full device, all drawing on its counter set."""
    parts = settings.gpu_partitions
    devices: list[Device] = []
    counter_sets: dict[str, dict[str, int | str]] = {}
    for i, gpu_uuid in enumerate(seeded_uuids(seed, "gpu", settings.num_gpus)):
        attributes: dict[str, bool | int | str] = {
            "index": i, "uuid": gpu_uuid, "model": MODEL, "driverVersion": DRIVER_VERSION
        }  # fmt: skip
        whole: dict[str, int | str] = {"memory": f"{MEMORY_GI}Gi", "compute": COMPUTE}
        shared = settings.gpu_allow_multiple_allocations
        if not parts:
            conditions, failures = binding_fields(settings)
            devices.append(
                Device(
                    f"gpu-{i}",
                    attributes=attributes,
                    capacity=capacity(whole, shared),
                    allow_multiple_allocations=shared,
                    binding_conditions=conditions,
                    binding_failure_conditions=failures,
                )
            )
            continue
        counters = f"gpu-{i}-counters"
        counter_sets[counters] = whole
        part: dict[str, int | str] = {
            "memory": quantity(MEMORY_GI * GI // parts),
            "compute": COMPUTE // parts,
        }
        shares = [(f"gpu-{i}-partition-{j}", {"partition": j}, part) for j in range(parts)]
        shares.append((f"gpu-{i}-full", {"full": True}, whole))
        devices.extend(
            Device(
                name,
                attributes={**attributes, **extra, "partitionable": True},
                capacity=capacity(amount, shared),
                consumes={counters: amount},
                allow_multiple_allocations=shared,
            )
            for name, extra, amount in shares
        )
    return Resource(RESOURCE, tuple(devices), serve_through="dra", counter_sets=counter_sets)


def capacity(amounts: dict[str, int | str], shared: bool) -> dict[str, int | str | Capacity]:
    """A GPU's memory and compute; shared, each claim takes what it asks for (all by default),
    in steps of 1Gi of memory and 1 of compute."""
    if not shared:
        return dict(amounts)
    steps: dict[str, int | str] = {"memory": "1Gi", "compute": 1}
    return {
        name: Capacity(amount, default=amount, min=steps[name], step=steps[name], max=amount)
        for name, amount in amounts.items()
    }


def quantity(size: int) -> str:
    """Bytes as the largest binary unit that divides them (``20Gi``, ``640Mi``)."""
    for unit, factor in (("Gi", GI), ("Mi", 2**20), ("Ki", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


class DraExampleBackend:
    """``num_gpus`` mock GPUs ``gpu-0`` .. ``gpu-<n-1>`` with the reference's attributes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._host_node = ""
        """The node the host told (``devicehost_host_facts``)."""
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

    @devicehost.hookimpl
    def devicehost_host_facts(self, facts: devicehost.HostFacts) -> None:
        with self._lock:
            self._host_node = facts.node_name

    def _node(self) -> str:
        return node_name(self._settings.node_name, self._host_node)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        with self._lock:
            settings, seed = self._settings, self._node()
        return [gpus(settings, seed)]

    @devicehost.hookimpl
    def devicehost_allocate(
        self, resource: str, device_ids: tuple[str, ...], claim: ClaimRequest | None
    ) -> ContainerAllocation:
        with self._lock:
            settings, node = self._settings, self._node()
        unknown = sorted(set(device_ids) - {d.id for d in gpus(settings, node).devices})
        if resource != RESOURCE or unknown:
            raise ValueError(f"no such GPU in {resource}: {', '.join(unknown) or device_ids}")
        config = claim.config if claim is not None and claim.config is not None else DEFAULT
        envs = {"KUBERNETES_NODE_NAME": node, "DRA_RESOURCE_DRIVER_NAME": DRIVER}
        for device in device_ids:
            envs |= gpu_env(device, config)
        if claim is not None:
            envs["DRA_ADMIN_ACCESS"] = "true" if claim.admin_access else "false"
            for device in device_ids:
                key = f"GPU_DEVICE_{device.removeprefix('gpu-').upper().replace('-', '_')}"
                envs[f"{key}_RESOURCE_CLAIM"] = claim.uid
                share = claim.shares.get(device)
                if share is not None:  # the reference's consumed capacity, and the share's ID
                    envs |= {f"{key}_{name.upper()}": amount for name, amount in share.consumed.items()}
                    envs[f"{key}_SHARE_ID"] = share.id
        return ContainerAllocation(envs=envs)

    @devicehost.hookimpl
    def devicehost_device_status(
        self, device_ids: tuple[str, ...], claim: ClaimRequest, prepared: bool
    ) -> dict[str, DeviceStatus]:
        with self._lock:
            settings, node = self._settings, self._node()
        gpu = {d.id: d for d in gpus(settings, node).devices}
        return device_status(settings, {i: gpu[i].attributes for i in device_ids if i in gpu}, prepared)
