"""The test kit's pytest plugin as a vendor meets it: loaded by pytest itself (a ``pytest11`` entry
point), free when unused, and the README's conformance command working from the checkout, from
any other directory and with only what ``devicehost[testing]`` installs.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "devicehost.testing.plugin"
HEAVY = ("grpc", "devicehost.host", "devicehost.standin", "devicehost.testing.host", "yaml")

UNUSED = f"""
import sys

def test_nothing_heavy_is_imported(request):
    assert request.config.pluginmanager.has_plugin({PLUGIN!r})
    assert [m for m in {HEAVY!r} if m in sys.modules] == []
"""

USED = """
from devicehost.testing import Host, KubeletStandIn

async def test_the_fixtures_serve_the_selected_backend(kubelet: KubeletStandIn, host: Host) -> None:
    await kubelet.wait_for_resource("example.com/widget", healthy=4)
    assert (await kubelet.allocate("example.com/widget", 1)).device_ids
"""


def pytest_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEVICEHOST_"))}


def run_pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=pytest_env(),
        timeout=120,
    )


def test_the_plugin_is_a_pytest11_entry_point_named_as_its_module() -> None:
    # Named as the module: `-p devicehost.testing.plugin` then finds it registered, not twice.
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.value == PLUGIN]
    assert entry.name == PLUGIN
    assert entry.dist is not None
    assert entry.dist.name == "devicehost"


def test_pytest_loads_the_kit_by_itself_and_unused_fixtures_import_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_unused.py").write_text(UNUSED)
    result = run_pytest("--devicehost-backend", "example", "test_unused.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.parametrize("extra", [[], ["-p", PLUGIN]], ids=["entry-point", "dash-p"])
def test_the_fixtures_work_without_and_with_dash_p(tmp_path: Path, extra: list[str]) -> None:
    (tmp_path / "test_used.py").write_text(USED)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\ndevicehost_backend = example\n"
    )
    result = run_pytest(*extra, "test_used.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def extra_testing() -> set[str]:
    """The distributions ``devicehost[testing]`` installs (setup.cfg), normalized."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["options.extras_require"]["testing"].split()
    return {canonicalize_name(Requirement(line).name) for line in lines}


def plugins_outside_the_testing_extra() -> list[str]:
    """``-p no:NAME`` for every installed pytest plugin a ``devicehost[testing]`` venv lacks."""
    allowed = extra_testing() | {"devicehost"}
    return [
        f"no:{entry.name}"
        for entry in importlib.metadata.entry_points(group="pytest11")
        if entry.dist is not None and canonicalize_name(entry.dist.name) not in allowed
    ]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_readme_conformance_command_runs_from_the_checkout_and_elsewhere(
    tmp_path: Path, where: str
) -> None:
    # As in a venv holding only devicehost[testing]: the checkout's tox.ini sets `timeout` and
    # `filterwarnings = error`, so a plugin it needs must come with the extra.
    blocked = [arg for name in plugins_outside_the_testing_extra() for arg in ("-p", name)]
    cwd = ROOT if where == "checkout" else tmp_path
    result = run_pytest(
        *blocked, "--pyargs", "devicehost.testing.conformance", "--devicehost-backend", "example", cwd=cwd
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout
