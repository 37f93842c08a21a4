"""The backend's settings (``backends.nvidia`` in the host config), validated with pydantic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from devicehost.hookspecs import rules

# XIDs that report an application's fault, not the GPU's: the default of NVIDIA's own device
# plugin (13, 31, 43, 45, 68, and 109 since its configurable health checks).
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


class FakeGpuSettings(BaseModel):
    """One GPU of the fake NVML (``nvml: fake``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    name: str = "NVIDIA Fake GPU"
    memory_bytes: int = Field(default=80 * 2**30, ge=0)
    minor: int = Field(default=0, ge=0)
    pci_bus_id: str = "0000:00:00.0"
    numa_node: int | None = 0
    nvlink_peers: tuple[str, ...] = ()


class Settings(BaseModel):
    """What ``backends.nvidia`` may hold; see the README for each setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource_name: str = "nvidia.com/gpu"
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    replicas: Annotated[int, Field(ge=1, le=256)] = 1
    cdi: bool = False
    cdi_kind: str = "nvidia.com/gpu"
    device_specs: bool = False
    health_checks: bool = True
    ignored_xids: frozenset[Annotated[int, Field(ge=0)]] = frozenset(DEFAULT_IGNORED_XIDS)
    recovery_check_interval: Annotated[float, Field(gt=0)] | None = 60.0
    sysfs_root: str = "/sys"
    nvml: Literal["real", "fake"] = "real"
    fake_gpus: tuple[FakeGpuSettings, ...] = ()

    @field_validator("resource_name")
    @classmethod
    def _resource_name(cls, value: str) -> str:
        problem = rules.resource_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("cdi_kind")
    @classmethod
    def _cdi_kind(cls, value: str) -> str:
        problem = rules.cdi_name_problem(f"{value}=x")
        if problem:
            raise ValueError(f"{value!r} is not a CDI kind (vendor.com/class)")
        return value

    @model_validator(mode="after")
    def _fake_gpus_only_with_fake_nvml(self) -> Settings:
        if self.fake_gpus and self.nvml != "fake":
            raise ValueError("fake_gpus needs nvml: fake")
        return self


def parse_settings(settings: Mapping[str, Any]) -> Settings:
    """Validate ``settings``; ValueError naming each bad field (``settings.<field>: why``)."""
    try:
        return Settings.model_validate(dict(settings))
    except ValidationError as error:
        problems = "; ".join(
            f"settings.{'.'.join(str(p) for p in e['loc']) or '(all)'}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(problems) from None
