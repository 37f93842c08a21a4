"""``GpuConfig``: the opaque configuration a claim or DeviceClass gives ``gpu.example.com``.

The same document as the reference driver's ``gpu.resource.example.com/v1alpha1`` GpuConfig,
as a pydantic model: the host validates each request's parameters with it before calling the
allocate hook, and refuses a claim whose parameters it refuses, naming the key path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, model_validator

ApiVersion = Literal["gpu.resource.example.com/v1alpha1"]
API_VERSION: ApiVersion = "gpu.resource.example.com/v1alpha1"

Interval = Literal["Default", "Short", "Medium", "Long"]


class TimeSlicingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: Interval = "Default"


class SpacePartitioningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    partitionCount: NonNegativeInt = 1


class GpuSharing(BaseModel):
    """How containers share a GPU; each strategy takes only its own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: Literal["TimeSlicing", "SpacePartitioning"]
    timeSlicingConfig: TimeSlicingConfig | None = None
    spacePartitioningConfig: SpacePartitioningConfig | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> GpuSharing:
        if self.strategy == "TimeSlicing" and self.spacePartitioningConfig is not None:
            raise ValueError("cannot use spacePartitioningConfig with the 'TimeSlicing' strategy")
        if self.strategy == "SpacePartitioning" and self.timeSlicingConfig is not None:
            raise ValueError("cannot use timeSlicingConfig with the 'SpacePartitioning' strategy")
        return self

    def setting(self) -> tuple[str, str]:
        """The strategy's one property as the container sees it: (name, value), defaults filled."""
        if self.strategy == "TimeSlicing":
            return "TIMESLICE_INTERVAL", (self.timeSlicingConfig or TimeSlicingConfig()).interval
        return "PARTITION_COUNT", str(
            (self.spacePartitioningConfig or SpacePartitioningConfig()).partitionCount
        )


class GpuConfig(BaseModel):
    """``{apiVersion: gpu.resource.example.com/v1alpha1, kind: GpuConfig, sharing: {...}}``;
    without ``sharing``: TimeSlicing at the Default interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: ApiVersion
    kind: Literal["GpuConfig"]
    sharing: GpuSharing = GpuSharing(strategy="TimeSlicing")


DEFAULT = GpuConfig(apiVersion=API_VERSION, kind="GpuConfig")
"""What a request without configuration gets (the reference's DefaultGpuConfig)."""
