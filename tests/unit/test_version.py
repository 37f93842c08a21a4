"""``devicehost.__version__`` comes from the installed distribution, read only when asked for."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import devicehost


def test_the_version_is_the_distributions() -> None:
    assert devicehost.__version__ == importlib.metadata.version("devicehost")
    assert "__version__" in devicehost.__all__


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        devicehost.nonesuch  # noqa: B018


def test_importing_the_package_reads_no_metadata() -> None:
    code = "import sys, devicehost; print('email.parser' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
