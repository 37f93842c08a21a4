"""The DRA example's binding conditions and device status (``binding``): a GPU is ready once its
ready file exists, and a prepared claim's status carries its uuid, model and driver version."""

from __future__ import annotations

from pathlib import Path

from devicehost import DeviceCondition, DeviceStatus
from devicehost_dra_example.binding import BINDING, FAILURE, BindingSettings, binding_fields, device_status

GPU = {"gpu-0": {"uuid": "gpu-aaaa", "model": "LATEST-GPU-MODEL", "driverVersion": "1.0.0", "index": 0}}


def test_without_binding_conditions_or_device_status_nothing_is_said() -> None:
    settings = BindingSettings()
    assert binding_fields(settings) == ((), ())
    assert device_status(settings, GPU, prepared=True) == {}


def test_a_gpu_is_attaching_until_its_ready_file_exists(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    settings = BindingSettings(binding_conditions=True, binding_ready_file=ready)
    assert binding_fields(settings) == ((BINDING,), (FAILURE,))
    waiting = DeviceCondition(status=False, reason="Attaching", message="waiting for the GPU to attach")
    assert device_status(settings, GPU, prepared=False) == {
        "gpu-0": DeviceStatus(conditions={BINDING: waiting})
    }
    ready.touch()
    (status,) = device_status(settings, GPU, prepared=False).values()
    assert status.conditions[BINDING].status is True


def test_a_prepared_claims_status_carries_the_gpus_facts() -> None:
    settings = BindingSettings(device_status=True)
    assert device_status(settings, GPU, prepared=False) == {}
    (status,) = device_status(settings, GPU, prepared=True).values()
    assert status.data == {"uuid": "gpu-aaaa", "model": "LATEST-GPU-MODEL", "driverVersion": "1.0.0"}
    assert status.conditions == {}
