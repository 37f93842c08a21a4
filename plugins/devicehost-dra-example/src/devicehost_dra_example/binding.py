"""The reference's binding conditions and device status, as devicehost values.

With ``binding_conditions`` each whole GPU is published with the reference's condition names
(``BindingConditions``, and ``BindingFailureConditions`` for failure): the scheduler binds a pod
that got one only once the backend reports it True. The reference's controller sets it True at
once; here the GPU is ready once ``binding_ready_file`` exists (at once when unset), so a test can
hold a pod back. With ``device_status`` a prepared claim's status carries, per GPU, its ``uuid``,
``model`` and ``driverVersion`` as ``data`` (the reference's ``BuildDeviceStatus``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from devicehost import DeviceCondition, DeviceStatus

BINDING = "BindingConditions"
FAILURE = "BindingFailureConditions"
DATA_ATTRIBUTES = ("uuid", "model", "driverVersion")


class BindingSettings(BaseModel):
    """The settings of this module, part of ``backends.dra-example``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    binding_conditions: bool = Field(
        default=False,
        description="publish whole GPUs with binding conditions (the reference's kubeletPlugin.bindingConditions)",
    )
    binding_ready_file: Path | None = Field(
        default=None,
        description="with binding_conditions: a GPU is ready once this file exists; unset: at once",
    )
    device_status: bool = Field(
        default=False, description="write uuid, model and driverVersion into a prepared claim's status"
    )


def binding_fields(settings: BindingSettings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A whole GPU's binding conditions and binding failure conditions."""
    return ((BINDING,), (FAILURE,)) if settings.binding_conditions else ((), ())


def device_status(
    settings: BindingSettings, attributes: Mapping[str, Mapping[str, object]], prepared: bool
) -> dict[str, DeviceStatus]:
    """What the claim's status shows of each GPU (by ID, with its attributes): its binding
    condition, and once prepared its data."""
    statuses = {}
    for device, found in attributes.items():
        conditions = {}
        if settings.binding_conditions:
            ready = settings.binding_ready_file is None or settings.binding_ready_file.exists()
            conditions[BINDING] = (
                DeviceCondition(status=True, reason="Ready", message="Device is ready")
                if ready
                else DeviceCondition(
                    status=False, reason="Attaching", message="waiting for the GPU to attach"
                )
            )
        data = (
            {k: str(found[k]) for k in DATA_ATTRIBUTES if k in found}
            if settings.device_status and prepared
            else None
        )
        if conditions or data:
            statuses[device] = DeviceStatus(conditions=conditions, data=data)
    return statuses
