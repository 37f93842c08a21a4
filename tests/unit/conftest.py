"""Fixtures the unit tests share: no DEVICEHOST_* variable leaks in; logging setup is recorded, not done."""

from __future__ import annotations

import os
from typing import Any

import pytest

from devicehost.host import logs


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DEVICEHOST_* variable of the shell running the tests leaks into the config."""
    for name in [n for n in os.environ if n.startswith("DEVICEHOST_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def logging_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """configure_logging's arguments; the real one would reconfigure logging for the whole session."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(logs, "configure_logging", lambda *args: calls.append(args))
    return calls
