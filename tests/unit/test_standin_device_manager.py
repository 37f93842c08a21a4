"""DeviceManager's answers before anything registers, and where the stand-in sits among the packages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import devicehost.standin
import devicehost.testing
import devicehost.testing.kubelet
from devicehost.standin.device_manager import DeviceManager
from devicehost.standin.kubelet import KubeletStandIn

NAME = "example.com/widget"


def test_an_unknown_resource_counts_nothing() -> None:
    manager = DeviceManager()
    assert (manager.resources, manager.events) == ([], [])
    assert (manager.registrations(NAME), manager.history(NAME)) == (0, [])
    assert (manager.capacity(NAME), manager.allocatable(NAME), manager.unhealthy(NAME)) == (0, 0, 0)
    for lookup in (manager.view, manager.options, manager.stub, manager.drop_stream, manager.release):
        with pytest.raises(KeyError):
            lookup(NAME)


async def test_waits_on_an_empty_manager_say_what_they_saw() -> None:
    manager = DeviceManager()
    with pytest.raises(
        AssertionError, match=r"example\.com/widget: wanted healthy=1 total=None .* never registered"
    ):
        await manager.wait_for_resource(NAME, healthy=1, timeout=0.02)
    with pytest.raises(AssertionError, match="no registered for any resource"):
        await manager.wait_for_event("registered", timeout=0.02)


def test_the_stand_in_is_the_device_manager_and_every_address_gives_the_same_class() -> None:
    assert issubclass(KubeletStandIn, DeviceManager)
    assert devicehost.standin.KubeletStandIn is KubeletStandIn
    assert devicehost.testing.KubeletStandIn is KubeletStandIn
    assert devicehost.testing.kubelet.KubeletStandIn is KubeletStandIn
    for name in devicehost.testing.kubelet.__all__:
        assert getattr(devicehost.testing.kubelet, name) is getattr(devicehost.standin, name)
    for name in devicehost.testing.__all__:
        assert getattr(devicehost.testing, name) is not None


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_stand_in_imports_neither_the_host_nor_the_test_kit() -> None:
    result = run_python(
        """
        import sys
        import devicehost.standin
        loaded = sorted(m for m in sys.modules if m.startswith(("devicehost.host", "devicehost.testing")))
        print(loaded)
        """
    )
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr


def test_the_test_kit_imports_without_pytest_except_its_pytest_modules() -> None:
    result = run_python(
        """
        import sys
        sys.modules["pytest"] = None  # any import of pytest now fails
        import devicehost.testing
        import devicehost.testing.host
        import devicehost.testing.kubelet
        for module in ("plugin", "conformance_support"):
            try:
                __import__(f"devicehost.testing.{module}")
            except ImportError:
                print(module, "needs pytest")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["plugin needs pytest", "conformance_support needs pytest"]
