"""A backend's optional settings model (``devicehost_settings_model``), over real Backend objects."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, PositiveInt

import devicehost
from devicehost import ContainerAllocation, Device, Resource
from devicehost.host.backends.backend import Backend, BackendContractError, SettingsRefused
from devicehost.host.backends.backend_set import BackendSet, refused_settings


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: PositiveInt = 1


class Loose(BaseModel):
    """No ``extra="forbid"``: the host still refuses unknown top-level keys."""

    count: PositiveInt = 4
    inner: Inner = Inner()


class Modelled:
    """Declares :class:`Loose`; keeps what its configure hook receives; refuses count 13 itself."""

    def __init__(self, model: Any = Loose) -> None:
        self.model = model
        self.received: list[object] = []

    @devicehost.hookimpl
    def devicehost_settings_model(self) -> Any:
        return self.model

    @devicehost.hookimpl
    def devicehost_configure(self, settings: Loose) -> None:
        if settings.count == 13:
            raise ValueError("count 13 is unlucky")
        self.received.append(settings)

    @devicehost.hookimpl
    def devicehost_discover(self) -> list[Resource]:
        return [Resource("example.com/m", (Device("m0"),))]

    @devicehost.hookimpl
    def devicehost_allocate(self, device_ids: tuple[str, ...]) -> ContainerAllocation:
        return ContainerAllocation()


@pytest.fixture
def plugin() -> Modelled:
    return Modelled()


@pytest.fixture
def backend(plugin: Modelled) -> Any:
    made = Backend("modelled", plugin, hook_timeout=2)
    yield made
    made.close()


async def test_configure_gets_the_validated_model_instance(backend: Backend, plugin: Modelled) -> None:
    await backend.configure({"count": "7", "inner": {"depth": 2}})
    assert plugin.received == [Loose(count=7, inner=Inner(depth=2))]


@pytest.mark.parametrize(
    ("settings", "problems"),
    [
        ({"cuont": 2}, ["backends.modelled.cuont: unknown key, did you mean 'count'?"]),
        ({"inner": {"dpeth": 2}}, ["backends.modelled.inner.dpeth: unknown key, did you mean 'depth'?"]),
        ({"count": 0}, ["backends.modelled.count: Input should be greater than 0 (got 0)"]),
        (
            {"count": "x", "zzz": 1},
            [
                "backends.modelled.zzz: unknown key (valid keys: count, inner)",
                "backends.modelled.count: Input should be a valid integer, unable to parse string as an "
                "integer (got 'x')",
            ],
        ),
    ],
)
async def test_refused_settings_name_the_key_path_and_never_reach_the_hook(
    backend: Backend, plugin: Modelled, settings: dict[str, Any], problems: list[str]
) -> None:
    with pytest.raises(SettingsRefused) as refused:
        await backend.configure(settings)
    assert list(refused.value.problems) == problems
    assert plugin.received == []


async def test_a_refused_reload_keeps_the_previous_settings(backend: Backend, plugin: Modelled) -> None:
    backends = BackendSet([backend])
    await backends.configure_all({"modelled": {"count": 2}})
    await backends.reconfigure("modelled", {"count": -1})
    assert plugin.received == [Loose(count=2)]
    assert "modelled" in backends.loaded


async def test_the_dry_run_reports_the_model_and_the_hook(backend: Backend) -> None:
    assert await refused_settings([backend], {"modelled": {"count": 2}}) == {}
    assert await refused_settings([backend], {"modelled": {"cuont": 2}}) == {
        "modelled": "backends.modelled.cuont: unknown key, did you mean 'count'?"
    }
    hook = await refused_settings([backend], {"modelled": {"count": 13}})
    assert hook["modelled"].startswith("backends.modelled: backend 'modelled' devicehost_configure raised")
    assert hook["modelled"].endswith("ValueError: count 13 is unlucky")


@pytest.mark.parametrize("model", [dict, "Loose", Loose()])
def test_a_model_that_is_no_pydantic_class_breaks_the_contract(model: object) -> None:
    with pytest.raises(BackendContractError, match="must return a pydantic model class"):
        Backend("modelled", Modelled(model), hook_timeout=2)


def test_no_model_keeps_the_mapping_form() -> None:
    backend = Backend("modelled", Modelled(None), hook_timeout=2)
    assert backend.settings_model is None
    assert backend.validated_settings({"anything": 1}) == {"anything": 1}
    backend.close()
