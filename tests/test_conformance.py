"""The test kit and the conformance command, run as vendors run them, against every bundled backend.

Each conformance run is ``pytest -p devicehost.testing.plugin --pyargs devicehost.testing.conformance``
in a subprocess, in an empty dir (so no project config applies), with warnings as errors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from cdi_guard import child_environ
from hostfakes import install_fake_distribution, install_test_backends

import devicehost
from devicehost.hookspecs.types import Device, Resource
from devicehost.testing.conformance_dra import device_id, dra_run, slice_problems
from devicehost.testing.conformance_support import (
    CHECKS,
    RULES,
    DirectBackend,
    cdi_resolution,
    held_together,
    load_plugin,
)
from devicehost.testing.host import BackendLoadError, host_process, running_host
from devicehost.testing.kubelet import KubeletStandIn

pytestmark = pytest.mark.timeout(90)

CONFORMANCE = ["-p", "devicehost.testing.plugin", "--pyargs", "devicehost.testing.conformance"]
STRICT = ["-p", "no:cacheprovider", "-W", "error", "-q", "-o", "asyncio_default_fixture_loop_scope=function"]
SUMMARY = re.compile(
    r"^(FAILED|ERROR) devicehost/testing/conformance\.py::(\w+) - Failed: \[([a-z-]+)\]", re.MULTILINE
)
"""A failure line: the suite's path (never empty, as pytest makes it for a module outside the
rootdir), the test, the rule it broke."""


def conformance(
    workdir: Path,
    backend: str,
    settings: object = None,
    *,
    dra: bool = False,
    site: Path | None = None,
    extra: Sequence[str] = (),
) -> tuple[int, dict[str, str], str]:
    """Run the conformance command (with the DRA checks when ``dra``, and backends installed in
    ``site`` too, and ``extra`` arguments); its exit status, broken rule by test name, and its output."""
    args = [*CONFORMANCE, "--devicehost-backend", backend, *(["--devicehost-dra"] if dra else []), *extra]
    if settings is not None:
        (workdir / "settings.yaml").write_text(yaml.safe_dump(settings))
        args += ["--devicehost-settings", "settings.yaml"]
    env = child_environ("PYTEST_")
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "300"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *args, *STRICT],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    return result.returncode, {test: rule for _, test, rule in SUMMARY.findall(output)}, output


def test_example_backend_conforms(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "example")
    assert (code, broken) == (0, {}), output
    assert "passed" in output
    assert "13 deselected" in output  # the DRA checks run only when asked for
    assert (
        "[dra-release-scope] test_dra_release_leaves_other_holders_alone: not run: pass --devicehost-dra"
        in output
    )


def test_example_backend_conforms_through_dra(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "example", dra=True)
    assert (code, broken) == (0, {}), output
    # preferred-allocation, dra-config-refused and dra-config-used (no claim config model),
    # dra-shares (no shared device), dra-counters twice (no counter sets) and dra-device-status
    # (no status hook): every other DRA check ran
    assert "29 passed, 7 skipped" in output
    assert "deselected" not in output


def test_dra_example_backend_conforms_through_dra(short_tmp: Path) -> None:
    """The port: a settings model, a claim config model, its resource declared served through DRA."""
    code, broken, output = conformance(short_tmp, "dra-example", dra=True)
    assert (code, broken) == (0, {}), output
    # the device plugin wire checks (served through DRA only), health both ways, preferred
    # allocation, start/stop, release: the backend implements none of them
    # and dra-shares, dra-counters (twice): not shared, no partitions; dra-config-used: one example
    assert "21 passed, 15 skipped" in output
    assert (
        "[dra-config-used] test_dra_claim_config_changes_what_a_container_gets: GpuConfig offers no two examples"
        in output
    )


def test_dra_example_with_partitions_conforms_with_its_counters(short_tmp: Path) -> None:
    code, broken, output = conformance(
        short_tmp, "dra-example", {"num_gpus": 2, "gpu_partitions": 4}, dra=True
    )
    assert (code, broken) == (0, {}), output
    assert "23 passed, 13 skipped" in output  # both dra-counters checks ran


def test_a_partition_bigger_than_its_counter_set_breaks_dra_counters(short_tmp: Path) -> None:
    site = short_tmp / "site"
    install_fake_distribution(
        site, "devicehost-big-part", "dh_big_part", BIG_PARTITION, "big-part = dh_big_part:Backend"
    )
    code, broken, output = conformance(short_tmp, "big-part", site=site)  # no --devicehost-dra
    assert (code, broken) == (1, {"test_counters_are_declared_and_fit": "dra-counters"}), output
    assert "device 'p1' consumes 20Gi of gpu-0/memory, which holds 16Gi: it can never be allocated" in output


BIG_PARTITION = """
import devicehost


class Backend:
    @devicehost.hookimpl
    def devicehost_discover(self):
        parts = [devicehost.Device(f"p{i}", consumes={"gpu-0": {"memory": size}}) for i, size in enumerate(("8Gi", "20Gi"))]
        return [devicehost.Resource("big.example.com/gpu", parts, counter_sets={"gpu-0": {"memory": "16Gi"}})]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource, device_ids):
        if set(device_ids) - {"p0", "p1"}:
            raise ValueError(f"no such partitions {device_ids}")
        return devicehost.ContainerAllocation(envs={"PARTS": ",".join(device_ids)})
"""


def test_dra_example_net_backend_conforms_with_its_shared_nics(short_tmp: Path) -> None:
    """The net profile: every NIC allows multiple allocations, so dra-shares runs and passes."""
    code, broken, output = conformance(short_tmp, "dra-example-net", {"num_nics": 2}, dra=True)
    assert (code, broken) == (0, {}), output
    assert "21 passed, 15 skipped" in output  # dra-shares runs; dra-device-status, dra-counters: not here


BROKEN_DRA = """
import threading
from typing import Literal

from pydantic import BaseModel, model_validator

import devicehost
from devicehost import cdi

KIND = "broken-dra.example.com/claim"
RENAMED = {"kind": "kind", "size": "size", "sharing": "size"}


class Config(BaseModel):
    kind: Literal["Config"]
    size: int = 1

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        return {RENAMED[key]: value for key, value in data.items()}  # KeyError for an unknown key


class BrokenDraBackend:
    def __init__(self):
        self.lock = threading.Lock()
        self.in_use = set()
        self.spec_devices = {}

    @devicehost.hookimpl
    def devicehost_claim_config_model(self):
        return Config

    @devicehost.hookimpl
    def devicehost_discover(self):
        shared = devicehost.Device("g2", allow_multiple_allocations=True)  # shares: held whole below
        return [devicehost.Resource("broken-dra.example.com/gpu", [*(devicehost.Device(i) for i in ("g0", "g1")), shared])]

    @devicehost.hookimpl
    def devicehost_allocate(self, resource, device_ids, claim):
        if set(device_ids) - {"g0", "g1", "g2"}:
            raise ValueError(f"no such devices {device_ids}")
        envs = {"GPUS": ",".join(device_ids)}
        if claim is None:
            return devicehost.ContainerAllocation(envs=envs)
        if claim.config is not None:
            envs["SIZE"] = str(claim.config["size"])  # written for a mapping: the hook gets a Config
        with self.lock:
            busy = self.in_use & set(device_ids)
            if busy:  # exclusive, whatever admin_access says
                raise RuntimeError(f"{sorted(busy)} in use")
            self.in_use |= set(device_ids)
            for device in device_ids:  # a CDI device per request: 'device/first-g0' is no CDI name
                edits = cdi.ContainerEdits(env={"GPU": device})
                self.spec_devices[f"{claim.name}-{device}"] = cdi.Device(f"{claim.name}-{device}", edits)
            cdi.write_spec(cdi.Spec(kind=KIND, devices=list(self.spec_devices.values())))
        return devicehost.ContainerAllocation(
            envs=envs, cdi_devices=[f"{KIND}={claim.name}-{device}" for device in device_ids]
        )

    @devicehost.hookimpl
    def devicehost_release(self, resource, device_ids):
        with self.lock:
            self.in_use -= set(device_ids)
"""


def test_kit_fails_a_dra_backend_naming_each_broken_dra_rule(short_tmp: Path) -> None:
    """A backend that breaks each new DRA rule in a way a vendor could: its allocate reads the
    configuration as a mapping, its model raises KeyError on an unknown key, it refuses a device
    an admin-access claim shares, and it names CDI devices after the request."""
    site = short_tmp / "site"
    install_fake_distribution(
        site,
        "devicehost-broken-dra",
        "dh_broken_dra",
        BROKEN_DRA,
        "broken-dra = dh_broken_dra:BrokenDraBackend",
    )
    code, broken, output = conformance(short_tmp, "broken-dra", dra=True, site=site)
    assert code == 1, output
    assert broken == {
        "test_dra_claim_config_reaches_the_hook": "dra-config",
        "test_dra_refused_config_fails_its_claim_alone": "dra-config-refused",
        "test_dra_admin_access_shares_a_held_device": "dra-admin-access",
        "test_dra_subrequest_claims_are_prepared": "dra-subrequest",
        "test_dra_shares_are_prepared_and_released_apart": "dra-shares",
    }, output
    assert set(broken.values()) <= set(RULES)
    assert "TypeError: 'Config' object is not subscriptable" in output
    assert "the model's validation raised KeyError: 'devicehostConformanceUnknown'" in output
    assert "['g0'] in use (an admin-access claim of g0, which a normal claim holds)" in output
    assert "CDI device name 'device/first-g0' must be letters, digits" in output
    assert "['g2'] in use" in output  # the second share of g2
    assert "[dra-prepare]" not in output  # claims without config, admin access or subrequests prepare


class ReleasingBackend:
    """Two widgets and a release hook, for the host-side guarantees the DRA rules rely on."""

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[devicehost.Resource]:
        return [
            devicehost.Resource(
                "release.example.com/widget", (devicehost.Device("w0"), devicehost.Device("w1"))
            )
        ]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> devicehost.ContainerAllocation:
        return devicehost.ContainerAllocation(envs={"WIDGETS": ",".join(device_ids)})

    @devicehost.hookimpl
    def devicehost_release(self, resource: str, device_ids: tuple[str, ...]) -> None:
        return None


async def test_dra_host_releases_a_shared_device_once_when_its_last_claim_goes(short_tmp: Path) -> None:
    """Host side of dra-admin-access, which no backend can break: unpreparing an admin-access
    claim of a device a normal claim holds releases nothing; unpreparing the normal one releases
    the device exactly once, whichever claim goes first."""
    cdi_dir = short_tmp / "cdi"
    cdi_dir.mkdir()
    async with dra_run(short_tmp, "releasing", ReleasingBackend(), {}, cdi_dir, hook_timeout=5.0) as run:
        [resource] = ReleasingBackend().devicehost_discover()
        await run.published(resource, ["w0", "w1"], "dra-admin-access")
        await run.registered(resource, "dra-admin-access")
        device = run.devices(resource)[0]  # type: ignore[index]
        released = [(resource.name, (device_id(device),))]
        for admin_first in (True, False):
            normal = run.claim(resource, [device["name"]])
            admin = run.claim(resource, [device["name"]], admin_access=True)
            await run.prepare(resource, normal, "dra-prepare")
            await run.prepare(resource, admin, "dra-admin-access")
            assert [c.admin_access for _, _, c in run.allocated(admin) if c] == [True]
            first, last = (admin, normal) if admin_first else (normal, admin)
            run.releases.clear()
            await run.unprepare(resource, first, "dra-unprepare")
            assert run.releases == [], admin_first
            assert run.prepared_claims(resource) == 1
            await run.unprepare(resource, last, "dra-unprepare")
            assert run.releases == released, admin_first
            assert run.prepared_claims(resource) == 0


async def test_dra_host_refuses_a_config_for_its_claim_alone_before_any_allocate(short_tmp: Path) -> None:
    """Host side of dra-config-refused: the key path in the claim's error, no allocate call for
    it, the other claim of the same call prepared."""
    cdi_dir = short_tmp / "cdi"
    cdi_dir.mkdir()
    plugin = load_plugin("dra-example")
    async with dra_run(short_tmp, "dra-example", plugin, {"num_gpus": 2}, cdi_dir, hook_timeout=5.0) as run:
        [resource] = DirectBackend("dra-example", plugin).discover()
        await run.published(resource, ["gpu-0", "gpu-1"], "dra-config")
        await run.registered(resource, "dra-config")
        valid = {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "GpuConfig"}
        wrong = {**valid, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Never"}}}
        bad = run.claim(resource, ["gpu-0"], config=wrong)
        good = run.claim(resource, ["gpu-1"], config=valid)
        error = await run.prepare_all(resource, [bad, good])
        assert error is not None
        assert f"failed for claim {bad[0]}/{bad[2]}: " in error
        assert "parameters.sharing.timeSlicingConfig.interval" in error
        assert good[2] not in error
        assert run.allocated(bad) == []
        [(_, ids, request)] = run.allocated(good)
        assert ids == ("gpu-1",)
        assert request is not None
        model = DirectBackend("dra-example", plugin).hook.devicehost_claim_config_model()
        assert request.config == model.model_validate(valid)


def test_hostdev_backend_conforms_on_a_fake_tree(short_tmp: Path) -> None:
    root = short_tmp / "root"
    for path in ("dev/ttyUSB0", "dev/ttyUSB1", "dev/fuse", "dev/net/tun", "run/foo"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()
    settings = {
        "root": str(root),
        "resources": [
            {"name": "devices.example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
            {"name": "devices.example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}], "count": 3}]},
            {
                "name": "devices.example.com/tun",
                "groups": [
                    {"paths": [{"path": "/dev/net/tun"}, {"path": "/run/foo", "type": "mount"}]},
                ],
            },
        ],
    }
    code, broken, output = conformance(short_tmp, "hostdev", settings)
    assert (code, broken) == (0, {}), output
    assert "passed" in output


def test_nvidia_backend_conforms_on_a_fake_nvml(short_tmp: Path) -> None:
    gpus = [{"uuid": f"GPU-{n}", "minor": n, "numa_node": n % 2} for n in range(3)]
    code, broken, output = conformance(
        short_tmp, "nvidia", {"nvml": "fake", "replicas": 2, "fake_gpus": gpus}
    )
    assert (code, broken) == (0, {}), output


def test_nonconformant_backend_fails_naming_each_broken_rule(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "broken-conformance")
    assert code == 1, output
    assert broken == {
        "test_resource_names_follow_the_kubelet_rule": "resource-name",
        "test_device_ids_follow_the_kubelet_rule": "device-id",
        "test_discovery_is_stable": "stable-discovery",
        "test_health_values_are_valid": "health-values",
        "test_health_goes_both_ways": "health-both-ways",
        "test_allocation_answers_are_well_formed": "allocation-answer",
        "test_backend_refuses_unknown_ids": "unknown-ids-backend",
        "test_every_device_allocates_over_the_wire": "allocation-wire",
        "test_kubelet_admission_succeeds": "admission",
        "test_preferred_allocation_is_well_formed": "preferred-allocation",
        "test_start_and_stop_repeat_and_release": "start-stop",
        "test_released_devices_come_back": "device-release",
        "test_reload_keeps_allocations_working": "reload",
    }, output
    assert set(broken.values()) <= set(RULES)
    assert (
        "9 passed" in output
    )  # loading, hook contract, start hook, CDI names, unknown IDs at the host, restart
    assert "device path 'dev/g0' must be absolute" in output
    assert "returned 1 device IDs, the kubelet asked for 2" in output


def test_example_backend_conforms_with_cdi_specs_in_the_kits_dir(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "example", {"cdi": True})
    assert (code, broken) == (0, {}), output
    assert "21 passed, 2 skipped" in output  # preferred-allocation and counters: example has neither


def test_kit_fails_a_backend_whose_cdi_names_no_spec_defines(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "unresolvable-cdi")
    assert code == 1, output
    assert broken == {
        "test_cdi_names_are_defined": "cdi-names",
        "test_reload_keeps_allocations_working": "reload",
    }, output
    # g0 and g1 resolve: the backend's spec went to the kit's CDI dir, and the kit read it there
    assert (
        "[cdi-names] every CDI device name an allocation returns resolves as a runtime with CDI resolves"
        in output
    )
    assert (
        "podbreakers.example.com/gpu g2: 'podbreakers.example.com/gpu=g2': defined by no spec in the CDI dir"
        in output
    )
    assert "=g0'" not in output
    assert not Path("/var/run/cdi/devicehost-podbreakers.example.com_gpu.json").exists()


def test_kit_fails_a_claim_prepared_with_cdi_names_no_spec_defines(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "unresolvable-cdi", dra=True)
    assert code == 1, output
    assert broken == {
        "test_cdi_names_are_defined": "cdi-names",
        "test_reload_keeps_allocations_working": "reload",
        "test_dra_claims_are_prepared": "dra-prepare",
    }, output
    assert (
        "podbreakers.example.com/gpu claim of ['g2']: 'podbreakers.example.com/gpu=g2': defined by no"
        " spec in the CDI dir" in output
    )
    assert "claim of ['g0']" not in output  # g0 and g1 were prepared and resolved


def test_slice_checks_name_what_the_api_server_refuses() -> None:
    good = {"name": "w-0", "attributes": {"id": {"string": "w_0"}, "example.com/model": {"int": 3}}}
    assert slice_problems([good]) == []
    bad = {
        "name": "W_0",
        "attributes": {
            "id": {"string": "x" * 65},
            "bad-name": {"int": 1},
            "ok": {"bool": "yes"},
            "two": {"int": 1, "bool": True},
        },
    }
    assert slice_problems([bad, {"name": "w-1"}, {"name": "w-1"}]) == [
        "device name 'W_0' is not a DNS label",
        f"W_0: attribute 'id': string '{'x' * 65}' is not a valid value (strings: at most 64)",
        "W_0: attribute 'bad-name': not a C identifier of at most 32 characters",
        "W_0: attribute 'ok': bool 'yes' is not a valid value (strings: at most 64)",
        "W_0: attribute 'two': {'int': 1, 'bool': True} must hold exactly one of bool, int, string, version",
        "device name 'w-1' appears twice",
    ]
    assert slice_problems([{"name": f"w-{n}"} for n in range(129)]) == [
        "129 devices in one slice, the API allows 128"
    ]


def test_kit_reports_a_failing_start_hook_once_with_its_exception(short_tmp: Path) -> None:
    code, broken, output = conformance(short_tmp, "failing-start")
    assert code == 1, output
    assert broken == {"test_start_hook_succeeds": "start-hook"}, output
    assert "OSError: cannot open the driver for podbreakers.example.com/nostart" in output
    assert "did not reach the kubelet" not in output  # the wire checks were skipped, not timed out
    assert "1 failed, 11 passed, 11 skipped" in output, output


def test_conformance_without_a_backend_says_how_to_choose_one(short_tmp: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *CONFORMANCE, "-p", "no:cacheprovider", "-q", "-x"],
        cwd=short_tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "no backend selected: pass --devicehost-backend NAME" in result.stdout


async def test_running_host_loads_installed_backends_by_name(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    settings = {"example": {"resources": {"example.com/gadget": 2}}}
    async with running_host(plugin_dir, ["example"], backends=settings) as host:
        view = await kubelet.wait_for_resource("example.com/gadget", healthy=2)
        assert [d.id for d in view.devices] == ["gadget-0", "gadget-1"]
        assert list(host.backends.loaded) == ["example"]


async def test_running_host_refuses_a_backend_that_breaks_the_contract(
    plugin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    install_test_backends(site)
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(
        BackendLoadError, match="asyncy: breaks the backend contract: hooks must be synchronous"
    ):
        async with running_host(plugin_dir, ["good", "asyncy"]):
            pytest.fail("the host started without one of its backends")


async def test_host_process_serves_and_logs_json(kubelet: KubeletStandIn, plugin_dir: Path) -> None:
    config = plugin_dir.parent / "config.yaml"
    config.write_text(yaml.safe_dump({"backends": {"example": {"resources": {"example.com/gizmo": 3}}}}))
    async with host_process(plugin_dir, ["example"], config_file=config) as child:
        await kubelet.wait_for_resource("example.com/gizmo", healthy=3)
        serving = await child.wait_for_log("serving", resource="example.com/gizmo")
        assert serving["backend"] == "example"
        assert await child.stop() == 0
    withdrawn = [line for line in child.lines if line.get("event") == "withdrawn"]
    assert [line["resource"] for line in withdrawn] == ["example.com/gizmo"]


X1_DRIVER = "accel.x1-vendor.example"


def x1_settings(workdir: Path, bug: str | None = None) -> dict[str, object]:
    """Two x1 cards (each whole and in four partitions), faults in ``workdir/faults``, one bug planted."""
    return {"cards": 2, "fault_file": str(workdir / "faults"), **({"bug": bug} if bug else {})}


def test_x1_conforms_under_the_operators_driver_name_and_names_what_it_skips(short_tmp: Path) -> None:
    """The issue's vendor backend, served both: a card's fault takes its four partitions down
    with it (health-both-ways and dra-health accept that), its two config examples give different
    answers, releasing one partition leaves the other's claim alone."""
    extra = ["--devicehost-driver-name", X1_DRIVER]
    code, broken, output = conformance(short_tmp, "x1", x1_settings(short_tmp), dra=True, extra=extra)
    assert (code, broken) == (0, {}), output
    assert "33 passed, 3 skipped" in output
    assert f"DRA rules ran under the driver names: (every resource)={X1_DRIVER}" in output
    assert "devicehost conformance: rules not checked, and why" in output
    assert (
        "[dra-shares] test_dra_shares_are_prepared_and_released_apart: no healthy device allows"
        " multiple allocations" in output
    )
    assert (
        "[preferred-allocation] test_preferred_allocation_is_well_formed: devicehost_preferred_allocation is not implemented"
        in output
    )
    assert (short_tmp / "faults").read_text() == ""


def test_the_dra_rules_run_under_the_drivers_the_operators_config_file_names(short_tmp: Path) -> None:
    (short_tmp / "host.yaml").write_text(yaml.safe_dump({"dra_drivers": {"x1.example.com/accel": X1_DRIVER}}))
    extra = ["--devicehost-config", "host.yaml", "-k", "test_dra_claims_are_prepared"]
    code, broken, output = conformance(short_tmp, "x1", x1_settings(short_tmp), dra=True, extra=extra)
    assert (code, broken) == (0, {}), output
    assert f"DRA rules ran under the driver names: x1.example.com/accel={X1_DRIVER}" in output
    assert "1 passed" in output


@pytest.mark.parametrize(
    ("bug", "dra", "test", "rule", "said"),
    [
        (
            "ignores-config",
            True,
            "test_dra_claim_config_changes_what_a_container_gets",
            "dra-config-used",
            "which X1Config reads as different, give a container the same edits",
        ),
        (
            "scrubs-card",
            True,
            "test_dra_release_leaves_other_holders_alone",
            "dra-release-scope",
            "unpreparing the claim of x1-0-p0 (two devices drawing on one counter set, the other x1-0-p1)"
            " took the other claim's CDI devices",
        ),
        (
            "big-partition",
            False,
            "test_counters_are_declared_and_fit",
            "dra-counters",
            "device 'x1-0-p3' consumes 40Gi of x1-0/memory, which holds 32Gi",
        ),
    ],
    ids=["ignores-config", "scrubs-card", "big-partition"],
)
def test_each_bug_planted_in_x1_is_named_by_its_rule(
    short_tmp: Path, bug: str, dra: bool, test: str, rule: str, said: str
) -> None:
    code, broken, output = conformance(short_tmp, "x1", x1_settings(short_tmp, bug), dra=dra)
    assert (code, broken) == (1, {test: rule}), output
    assert said in output


def test_the_kit_clears_the_fault_it_set_when_a_health_rule_fails(short_tmp: Path) -> None:
    """A backend that never reports the fault the suite writes to its fault file: both health
    rules fail, and the fault file is empty again after each (the next run finds the card healthy)."""
    settings = x1_settings(short_tmp, "silent-health")
    code, broken, output = conformance(short_tmp, "x1", settings, dra=True, extra=["-k", "health"])
    assert (code, broken) == (
        1,
        {
            "test_health_goes_both_ways": "health-both-ways",
            "test_dra_unhealthy_devices_leave_the_slice": "dra-health",
        },
    ), output
    assert "device x1-0 never turned Unhealthy at the kubelet" in output
    assert (short_tmp / "faults").read_text() == ""


def test_every_check_of_the_suite_names_its_rule() -> None:
    from devicehost.testing import conformance as suite

    tests = sorted(name for name in vars(suite) if name.startswith("test_"))
    assert sorted(CHECKS) == tests
    fixtures_only = {"settings", "discovery-shape"}  # broken by the direct fixture, for every check
    assert set(CHECKS.values()) == set(RULES) - fixtures_only


def test_devices_sharing_counters_are_allocated_in_groups_the_counters_hold() -> None:
    """A card and its two partitions draw on one set: the card, then the partitions together; a
    partition too big for its set alone counts for nothing (the host leaves it out of its math)."""
    card = Device("c0", consumes={"c0": {"memory": "32Gi"}})
    parts = [Device(f"c0-p{n}", consumes={"c0": {"memory": "16Gi"}}) for n in range(2)]
    big = Device("c0-big", consumes={"c0": {"memory": "40Gi"}})
    plain = Device("other")
    resource = Resource(
        "x.example.com/a", (card, *parts, big, plain), counter_sets={"c0": {"memory": "32Gi"}}
    )
    assert held_together(resource, ["c0", "c0-p0", "c0-p1", "c0-big", "other"]) == [
        ["c0", "c0-big", "other"],
        ["c0-p0", "c0-p1"],
    ]
    without = Resource("x.example.com/b", (Device("a"), Device("b")))
    assert held_together(without, ["a", "b"]) == [["a", "b"]]


def test_cdi_names_resolve_as_a_runtime_resolves_them(short_tmp: Path) -> None:
    """One valid spec defining a name resolves it to its edits (the spec's own, then the
    device's); a spec a runtime skips (no cdiVersion) defines nothing; a name two specs define
    is refused."""
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "x1.example.com/claim",
        "containerEdits": {"env": ["X1=1"]},
        "devices": [
            {"name": "a", "containerEdits": {"env": ["A=1"]}},
            {"name": "b", "containerEdits": {"env": ["B=1"]}},
        ],
    }
    (short_tmp / "one.json").write_text(json.dumps(spec))
    (short_tmp / "two.yaml").write_text(
        yaml.safe_dump({**spec, "devices": [{"name": "b", "containerEdits": {"env": ["B=2"]}}]})
    )
    (short_tmp / "bad.json").write_text(json.dumps({**spec, "cdiVersion": None, "devices": [{"name": "c"}]}))
    edits, problems = cdi_resolution(["x1.example.com/claim=a"], short_tmp)
    assert (edits["env"], problems) == (["A=1", "X1=1"], [])
    _, problems = cdi_resolution(["x1.example.com/claim=b", "x1.example.com/claim=c"], short_tmp)
    assert problems == [
        "'x1.example.com/claim=b': defined by 2 specs (one.json, two.yaml) in the CDI dir",
        "'x1.example.com/claim=c': defined by no spec in the CDI dir (bad.json skipped: no cdiVersion)",
    ]


SHARE_WIPER = """
import threading

import devicehost
from devicehost import cdi

KIND = "wiper.example.com/share"
UID = 36


class Backend:
    def __init__(self):
        self.lock = threading.Lock()
        self.claimed = {}

    @devicehost.hookimpl
    def devicehost_discover(self):
        nics = [devicehost.Device("nic0", allow_multiple_allocations=True), devicehost.Device("nic1")]
        return [devicehost.Resource("wiper.example.com/nic", nics)]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids, claim):
        if set(device_ids) - {"nic0", "nic1"}:
            raise ValueError(f"no such NICs {device_ids}")
        if claim is None:
            return devicehost.ContainerAllocation(envs={"NICS": ",".join(device_ids)})
        with self.lock:
            for device in device_ids:
                name = f"{claim.uid}-{device}"
                self.claimed[name] = cdi.Device(name, cdi.ContainerEdits(env={"NIC": device}))
            cdi.write_spec(cdi.Spec(kind=KIND, devices=list(self.claimed.values())))
        return devicehost.ContainerAllocation(cdi_devices=[f"{KIND}={claim.uid}-{d}" for d in device_ids])

    @devicehost.hookimpl
    def devicehost_release(self, device_ids):
        with self.lock:  # resets the whole NIC, whichever share went: every share loses it
            for name in [n for n in self.claimed if n[UID + 1 :] in device_ids]:
                del self.claimed[name]
            if self.claimed:
                cdi.write_spec(cdi.Spec(kind=KIND, devices=list(self.claimed.values())))
            else:
                cdi.remove_spec(KIND)
"""


def test_a_release_of_one_share_that_resets_the_device_breaks_dra_release_scope(short_tmp: Path) -> None:
    site = short_tmp / "site"
    install_fake_distribution(site, "devicehost-wiper", "dh_wiper", SHARE_WIPER, "wiper = dh_wiper:Backend")
    code, broken, output = conformance(short_tmp, "wiper", dra=True, site=site)
    assert (code, broken) == (1, {"test_dra_release_leaves_other_holders_alone": "dra-release-scope"}), output
    assert "unpreparing the claim of nic0 (two shares of one device, the other nic0) took the other" in output


def test_the_walkthrough_names_every_dra_rule() -> None:
    """docs/writing-a-backend.md says what each DRA rule checks, by its ID (the device plugin
    rules it describes in prose)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "writing-a-backend.md").read_text()
    assert [rule for rule in RULES if rule.startswith("dra-") and f"`{rule}`" not in text] == []
