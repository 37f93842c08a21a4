"""What a container gets for its GPUs: NVIDIA_VISIBLE_DEVICES or CDI names, and device nodes."""

from __future__ import annotations

from collections.abc import Sequence

from devicehost import ContainerAllocation, DeviceSpec
from devicehost_nvidia.inventory import Gpu

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def container_allocation(
    gpus: Sequence[Gpu], *, cdi_kind: str | None, device_specs: bool
) -> ContainerAllocation:
    """The allocation for distinct ``gpus`` (replicas already folded into their GPU).

    :param cdi_kind: return ``<cdi_kind>=<uuid>`` CDI names instead of the environment variable.
    :param device_specs: also expose ``/dev/nvidia<minor>`` and the control devices.
    """
    uuids = [gpu.uuid for gpu in gpus]
    paths = [f"/dev/nvidia{gpu.info.minor}" for gpu in gpus] + list(CONTROL_DEVICES)
    return ContainerAllocation(
        envs={} if cdi_kind else {VISIBLE_DEVICES_ENV: ",".join(uuids)},
        cdi_devices=[f"{cdi_kind}={uuid}" for uuid in uuids] if cdi_kind else [],
        devices=[DeviceSpec(container_path=path, host_path=path) for path in paths] if device_specs else [],
    )
