"""DRA names: devices are DNS labels, slices DNS subdomains, CDI names what the CDI rules accept."""

from __future__ import annotations

import re

import pytest

from devicehost.hookspecs import rules
from devicehost.host.dra import names

LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@pytest.mark.parametrize("device_id", ["w0", "gpu-0", "0", "a" * 63])
def test_a_device_id_that_is_a_label_is_its_own_name(device_id: str) -> None:
    assert names.device_name(device_id) == device_id


@pytest.mark.parametrize("device_id", ["GPU_0", "gpu_0", "a" * 64, "___", "-x-", "0000:3b:00.0", "ü"])
def test_a_device_id_that_is_not_a_label_is_mapped_to_one(device_id: str) -> None:
    name = names.device_name(device_id)
    assert len(name) <= names.MAX_LABEL
    assert LABEL.fullmatch(name), name
    assert name != device_id
    assert re.search(r"-[0-9a-f]{8}$", name), name  # the hash that keeps mapped IDs apart
    assert names.device_name(device_id) == name  # stable: a restart publishes the same name


def test_two_ids_that_clean_to_the_same_label_never_share_a_name() -> None:
    ids = ["GPU_0", "gpu_0", "gpu-0-", "Gpu.0", "gpu 0", "a" * 64, "a" * 65, "a" * 63 + "_"]
    mapped = [names.device_name(i) for i in ids]
    assert len(set(mapped)) == len(ids), mapped
    assert "gpu-0" not in mapped  # nor the name of the ID "gpu-0", which is a label itself


def test_a_slice_name_is_a_dns_subdomain_of_at_most_253_characters() -> None:
    assert names.slice_name("node-a", "example.com", "example.com/widget") == "node-a-example.com-widget"
    assert (
        names.slice_name("Node_A", "example.com", "example.com/My_Widget") == "node-a-example.com-my-widget"
    )
    long_node = "n" * 250
    first = names.slice_name(long_node, "example.com", "example.com/a")
    second = names.slice_name(long_node, "example.com", "example.com/b")
    for name in (first, second):
        assert len(name) <= 253
        assert SUBDOMAIN.fullmatch(name), name
    assert first != second  # truncated, yet kept apart by the hash of the whole


def test_a_pool_is_the_node_and_the_resources_class_as_a_label() -> None:
    assert names.pool_name("node-a", "example.com/widget") == "node-a/widget"
    node, _, device_class = names.pool_name("node-a", "example.com/My_Widget").partition("/")
    assert node == "node-a"
    assert LABEL.fullmatch(device_class), device_class


def test_the_driver_is_the_configured_one_else_the_resources_domain() -> None:
    assert names.driver_name("example.com/widget", {}) == "example.com"
    assert (
        names.driver_name("example.com/widget", {"example.com/widget": "gpu.example.com"})
        == "gpu.example.com"
    )


def test_a_cdi_kind_is_unique_per_claim() -> None:
    assert names.cdi_kind("example.com", "uid-1") == "example.com/claim-uid-1"
    assert names.cdi_kind("example.com", "uid-1") != names.cdi_kind("example.com", "uid-2")


def test_a_cdi_device_is_the_request_and_the_class() -> None:
    assert names.cdi_device_name("gpu", "example.com/widget") == "gpu.widget"


def test_a_subrequest_becomes_a_cdi_name_the_cdi_rules_accept() -> None:
    """The bug of issue 24: ``gpu/older.widget`` was refused, so firstAvailable never prepared."""
    device = names.cdi_device_name("gpu/older", "example.com/widget")
    assert device == "gpu_older.widget"
    qualified = f"{names.cdi_kind('example.com', '0f0f0f0f-1234')}={device}"
    assert rules.cdi_name_problem(qualified) is None
    # what it used to be is refused by the same rule: the assertion above is not vacuous
    assert rules.cdi_name_problem(f"{names.cdi_kind('example.com', '0f0f0f0f-1234')}=gpu/older.widget")


def test_a_cdi_device_of_a_class_that_is_no_label_is_still_accepted() -> None:
    device = names.cdi_device_name("gpu/older", "example.com/My_Widget")
    assert rules.cdi_name_problem(f"example.com/claim-u={device}") is None
