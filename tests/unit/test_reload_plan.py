"""reload.plan: a new configuration against the running one, as a pure plan."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pytest

from devicehost.host.config import IN_PLACE, NEXT_START, HostConfig, on_reload, restart_only_keys
from devicehost.host.reload import ReloadPlan, plan

INSTALLED = ("a", "b", "c")


def config(**values: Any) -> HostConfig:
    return HostConfig(**values)


def reload(
    old: HostConfig,
    new: HostConfig,
    *,
    installed: Sequence[str] = INSTALLED,
    loaded: Collection[str] = INSTALLED,
    failed: Collection[str] = (),
) -> ReloadPlan:
    return plan(old, new, installed=installed, loaded=loaded, failed=failed)


def test_no_change_is_an_empty_plan() -> None:
    old = config(backends={"a": {"x": 1}}, enabled_backends=("a", "b"))
    new = config(backends={"a": {"x": 1}}, enabled_backends=("a", "b"))
    assert reload(old, new, loaded=("a", "b")) == ReloadPlan(config=new)
    assert reload(old, new, loaded=("a", "b")).changed == ()


RESTART_VALUES = {
    "device_plugins_dir": Path("/var/lib/k0s/kubelet/device-plugins"),
    "allow_symlinked_dirs": True,
    "plugins_registry_dir": Path("/elsewhere/plugins_registry"),
    "registration_mode": "watcher",
    "metrics_address": "127.0.0.1:9464",
    "socket_mode": 0o660,
    "log_format": "json",
    "log_level": "debug",
    "device_release": False,
    "pod_resources_socket": Path("/var/lib/k0s/kubelet/pod-resources/kubelet.sock"),
    "pod_resources_interval": 5.0,
    "preferred_allocation": {"example.com/widget": "numa-pack"},
    "serve_through": {"example": "device-plugin"},
    "dra_drivers": {"example.com/widget": "widgets.example.com"},
    "dra_plugins_dir": Path("/elsewhere/plugins"),
    "node_name": "node-a",
    "kubeconfig": Path("/etc/kubeconfig"),
    "dra_unhealthy_taint": "NoExecute",
}


def test_every_restart_key_is_covered() -> None:
    assert set(RESTART_VALUES) == set(restart_only_keys())


def test_every_setting_is_marked_in_place_or_next_start_on_the_model() -> None:
    """One mark per field, on the model: nothing to keep in step by hand."""
    for key in HostConfig.model_fields:
        assert on_reload(key) in (IN_PLACE, NEXT_START), key
    in_place = {key for key in HostConfig.model_fields if on_reload(key) == IN_PLACE}
    assert in_place == set(HostConfig.model_fields) - set(restart_only_keys())
    assert {
        "rediscover_interval",
        "health_interval",
        "hook_timeout",
        "register_timeout",
        "cdi_dir",
    } <= in_place


def test_an_unmarked_setting_is_refused() -> None:
    from pydantic import Field, create_model

    unmarked = create_model("Unmarked", __base__=HostConfig, extra_key=(int, Field(1)))
    import devicehost.host.config as config_module

    original = config_module.HostConfig
    config_module.HostConfig = unmarked  # type: ignore[misc]
    try:
        with pytest.raises(LookupError, match=r"HostConfig\.extra_key must be marked IN_PLACE or NEXT_START"):
            config_module.restart_only_keys()
    finally:
        config_module.HostConfig = original  # type: ignore[misc]


@pytest.mark.parametrize(("key", "value"), list(RESTART_VALUES.items()), ids=list(RESTART_VALUES))
def test_a_restart_key_change_is_deferred_and_kept(key: str, value: object) -> None:
    old = config()
    assert getattr(old, key) != value
    new = config(**{key: value}, hook_timeout=3.0)
    result = reload(old, new)
    assert result.deferred == (key,)
    assert getattr(result.config, key) == getattr(old, key)
    assert result.config.hook_timeout == 3.0, "the other changes still apply"
    assert result.changed == ("hook_timeout",)
    assert (result.disable, result.load, result.reconfigure) == ((), (), ())


def test_several_restart_keys_are_deferred_sorted() -> None:
    new = config(log_level="error", device_plugins_dir=Path("/x"), metrics_address="0.0.0.0:1")
    result = reload(config(), new)
    assert result.deferred == ("device_plugins_dir", "log_level", "metrics_address")
    assert result.config == config()
    assert result.changed == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("rediscover_interval", 2.5, id="rediscover_interval"),
        pytest.param("health_interval", 0.5, id="health_interval"),
        pytest.param("hook_timeout", 30.0, id="hook_timeout"),
        pytest.param("register_timeout", 1.0, id="register_timeout"),
        pytest.param("cdi_dir", Path("/etc/cdi"), id="cdi_dir"),
    ],
)
def test_a_setting_that_applies_now(key: str, value: object) -> None:
    old = config()
    assert getattr(old, key) != value
    new = config(**{key: value})
    result = reload(old, new)
    assert result == ReloadPlan(config=new, changed=(key,))
    assert getattr(result.config, key) == value


@pytest.mark.parametrize(
    ("old", "new", "loaded", "failed", "expected"),
    [
        pytest.param(
            config(enabled_backends=("a",)),
            config(enabled_backends=("a", "b")),
            ("a",),
            (),
            {"load": ("b",)},
            id="enabled-adds-an-installed-backend",
        ),
        pytest.param(
            config(enabled_backends=("a",)),
            config(enabled_backends=("c", "a", "b")),
            ("a",),
            (),
            {"load": ("c", "b")},
            id="load-follows-the-enabled-order",
        ),
        pytest.param(
            config(enabled_backends=("a",)),
            config(),
            ("a",),
            (),
            {"load": ("b", "c")},
            id="empty-enabled-loads-every-installed",
        ),
        pytest.param(
            config(),
            config(enabled_backends=("a", "b")),
            ("a", "b", "c"),
            (),
            {"disable": ("c",)},
            id="enabled-removes-a-loaded-backend",
        ),
        pytest.param(
            config(),
            config(disabled_backends=("b",)),
            ("a", "b", "c"),
            (),
            {"disable": ("b",)},
            id="disabled-disables-a-loaded-backend",
        ),
        pytest.param(
            config(),
            config(disabled_backends=("b",)),
            ("a", "c"),
            ("b",),
            {},
            id="disabling-a-failed-backend-disables-nothing",
        ),
        pytest.param(
            config(disabled_backends=("b",)),
            config(),
            ("a", "c"),
            (),
            {"load": ("b",)},
            id="no-longer-disabled-is-loaded",
        ),
        pytest.param(
            config(backends={"b": {"mode": "bad"}}),
            config(backends={"b": {"mode": "good"}}),
            ("a", "c"),
            ("b",),
            {"load": ("b",)},
            id="failed-backend-with-changed-settings-loads-again",
        ),
        pytest.param(
            config(),
            config(backends={"b": {"mode": "good"}}),
            ("a", "c"),
            ("b",),
            {"load": ("b",)},
            id="failed-backend-given-settings-loads-again",
        ),
        pytest.param(
            config(backends={"b": {"mode": "bad"}}),
            config(backends={"b": {"mode": "bad"}, "a": {"x": 1}}),
            ("a", "c"),
            ("b",),
            {"reconfigure": ("a",)},
            id="failed-backend-with-unchanged-settings-does-not-load",
        ),
        pytest.param(
            config(backends={"a": {"x": 1}, "b": {"y": 1}}),
            config(backends={"a": {"x": 2}, "b": {"y": 1}, "c": {"z": 1}}),
            ("a", "b", "c"),
            (),
            {"reconfigure": ("a", "c")},
            id="loaded-backends-with-changed-settings-reconfigure",
        ),
        pytest.param(
            config(enabled_backends=("a",)),
            config(enabled_backends=("a", "b"), backends={"b": {"y": 1}}),
            ("a",),
            (),
            {"load": ("b",)},
            id="newly-loaded-is-not-also-reconfigured",
        ),
        pytest.param(
            config(backends={"b": {"y": 1}}),
            config(disabled_backends=("b",), backends={"b": {"y": 2}}),
            ("a", "b", "c"),
            (),
            {"disable": ("b",)},
            id="disabled-is-not-also-reconfigured",
        ),
        pytest.param(
            config(enabled_backends=("a",)),
            config(enabled_backends=("a", "ghost"), backends={"ghost": {"x": 1}}),
            ("a",),
            (),
            {},
            id="enabled-names-not-installed-are-ignored",
        ),
        pytest.param(
            config(),
            config(disabled_backends=("ghost",)),
            ("a", "b", "c"),
            (),
            {},
            id="disabled-names-not-installed-are-ignored",
        ),
        pytest.param(
            config(enabled_backends=("a", "b")),
            config(enabled_backends=("a", "c"), backends={"a": {"x": 1}}),
            ("a", "b"),
            (),
            {"disable": ("b",), "load": ("c",), "reconfigure": ("a",)},
            id="disable-load-and-reconfigure-at-once",
        ),
    ],
)
def test_backend_changes(
    old: HostConfig,
    new: HostConfig,
    loaded: Collection[str],
    failed: Collection[str],
    expected: dict[str, tuple[str, ...]],
) -> None:
    result = reload(old, new, loaded=loaded, failed=failed)
    assert {
        "disable": result.disable,
        "load": result.load,
        "reconfigure": result.reconfigure,
    } == {"disable": (), "load": (), "reconfigure": (), **expected}
    assert result.config == new
    assert result.deferred == ()
    assert result.changed == tuple(
        sorted(
            k
            for k in ("enabled_backends", "disabled_backends", "backends")
            if getattr(old, k) != getattr(new, k)
        )
    )


def test_a_backend_no_longer_installed_is_disabled() -> None:
    result = reload(config(), config(), installed=("a",), loaded=("a", "b"))
    assert result.disable == ("b",)
    assert result.load == ()


def test_the_plan_does_not_change_its_inputs() -> None:
    old = config(enabled_backends=("a",), log_level="debug")
    new = config(enabled_backends=("a", "b"), log_level="error")
    result = reload(old, new, loaded=["a"])
    assert new.log_level == "error"
    assert result.config.log_level == "debug"
    assert result.config is not new
