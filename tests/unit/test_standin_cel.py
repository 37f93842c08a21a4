"""DRA's CEL in the stand-in: the device Kubernetes shows a selector, and its quantity and semver functions."""

from __future__ import annotations

import pytest

from devicehost.standin.cel import SelectorError, compile_selector, device_variable

DEVICE = device_variable(
    "gpu.example.com",
    {
        "name": "gpu-0",
        "attributes": {
            "index": {"int": 0},
            "model": {"string": "LATEST-GPU-MODEL"},
            "healthy": {"bool": True},
            "driverVersion": {"version": "1.2.3"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "1500m"}},
        "allowMultipleAllocations": True,
    },
)


def matches(expression: str) -> bool:
    return compile_selector(expression).matches(DEVICE)


@pytest.mark.parametrize(
    "expression",
    [
        "device.driver == 'gpu.example.com'",
        "device.attributes['gpu.example.com'].index == 0",
        "device.attributes['gpu.example.com'].model.startsWith('LATEST')",
        "device.attributes['gpu.example.com'].healthy",
        "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:00'",
        "device.allowMultipleAllocations",
        "!('index' in device.attributes['other.example.com'])",  # a domain it lacks: empty
        "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) == 0",
        "device.capacity['gpu.example.com'].memory == quantity('80Gi')",
        "device.capacity['gpu.example.com'].memory.isGreaterThan(quantity('79Gi'))",
        "device.capacity['gpu.example.com'].compute.isLessThan(quantity('2'))",
        "device.capacity['gpu.example.com'].memory.sub(quantity('16Gi')) == quantity('64Gi')",
        "device.capacity['gpu.example.com'].compute.add(1).compareTo(quantity('2500m')) == 0",
        "device.capacity['gpu.example.com'].memory.asInteger() == 85899345920",
        "!device.capacity['gpu.example.com'].compute.isInteger()",
        "device.capacity['gpu.example.com'].compute.asApproximateFloat() == 1.5",
        "device.capacity['gpu.example.com'].memory.sign() == 1",
        "isQuantity('16Gi') && !isQuantity('sixteen')",
        "device.attributes['gpu.example.com'].driverVersion.isGreaterThan(semver('1.2.0'))",
        "device.attributes['gpu.example.com'].driverVersion == semver('1.2.3')",
        "device.attributes['gpu.example.com'].driverVersion.major() == 1",
        "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
        "isSemver('1.2.3') && !isSemver('1.2')",
        "device.attributes['gpu.example.com'].nope == 1 || true",  # CEL: an error or true is true
    ],
)
def test_what_a_dra_selector_sees(expression: str) -> None:
    assert matches(expression)


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        (
            "device.attributes['gpu.example.com'].nope == 1",
            "CEL runtime error: no such member in mapping: 'nope'",
        ),
        ("device.attributes['gpu.example.com'].index", "must evaluate to bool, got IntType"),
        (
            "device.capacity['gpu.example.com'].compute.asInteger() == 1",
            "CEL runtime error: asInteger: 1.500 is not an integer",
        ),
        ("quantity('lots') == quantity('1')", "CEL runtime error: 'lots' is not a quantity"),
        (
            "quantity('1').compareTo(semver('1.0.0')) == 0",
            "CEL runtime error: compareTo: no overload for Quantity and Semver",
        ),
    ],
)
def test_a_selector_that_fails_says_why(expression: str, said: str) -> None:
    with pytest.raises(SelectorError) as failed:
        matches(expression)
    assert str(failed.value).startswith(said)


def test_a_selector_that_does_not_compile_is_refused() -> None:
    with pytest.raises(SelectorError, match=r"^compilation failed"):
        compile_selector("device.driver ==")
