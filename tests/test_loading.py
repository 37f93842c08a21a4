"""Loading backends from entry points: isolation, allow/disable lists, the contract checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from devicehost.host.backends.loader import UnknownBackendError, load_backends


def test_broken_backends_are_reported_and_the_good_one_loads(fake_site: Path) -> None:
    statuses = {s.name: s for s in load_backends(["good", "broken", "asyncy", "typo"], [], 1.0)}
    assert statuses["good"].backend is not None
    assert statuses["good"].distribution == "devicehost-good"
    assert statuses["good"].version == "1.2.3"
    broken = statuses["broken"]
    assert broken.backend is None
    assert "ModuleNotFoundError" in (broken.error or "")
    assert "reinstall or upgrade it, or disable the backend" in (broken.error or "")
    assert "async: devicehost_discover" in (statuses["asyncy"].error or "")
    assert "devicehost_alocate" in (statuses["typo"].error or "")
    assert "backend's author must fix it" in (statuses["typo"].error or "")


def test_allow_list_keeps_its_order_and_disable_list_wins(fake_site: Path) -> None:
    statuses = load_backends(["typo", "good", "example"], ["typo"], 1.0)
    assert [s.name for s in statuses] == ["good", "example"]
    assert all(s.backend is not None for s in statuses)


def test_all_installed_backends_load_in_name_order(fake_site: Path) -> None:
    statuses = load_backends([], ["broken"], 1.0)
    names = [s.name for s in statuses]
    assert names == sorted(names)
    assert {"good", "example", "asyncy", "typo", "broken"} <= set(names)
    assert next(s for s in statuses if s.name == "broken").disabled


def test_unknown_backend_names_are_an_error(fake_site: Path) -> None:
    with pytest.raises(
        UnknownBackendError, match=r"unknown backend\(s\): nosuch \(in enabled_backends\); installed: .*good"
    ):
        load_backends(["good", "nosuch"], [], 1.0)
