"""Which backend checks which DRA driver in ``devicehost webhook``, and its small parsers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from devicehost.hookspecs.types import Resource
from devicehost.host.backends.backend import HookError, SettingsRefused
from devicehost.host.config import HostConfig
from devicehost.host.webhook import drivers
from devicehost.host.webhook.drivers import build_table, parse_named_drivers, served_through_dra
from devicehost.host.webhook.server import split_address


class Model(BaseModel):
    pass


class FakeBackend:
    def __init__(
        self,
        name: str,
        resources: Sequence[Resource] = (),
        *,
        fails: Exception | None = None,
        model: bool = True,
    ) -> None:
        self.name = name
        self.resources = resources
        self.fails = fails
        self.claim_config_model = Model if model else None
        self.configured: list[Mapping[str, Any]] = []
        self.closed = False
        self.bound_to = ""

    @property
    def link(self) -> Any:
        return self

    def bind(self, context: Any) -> None:
        self.bound_to = context.node_name

    async def configure(self, settings: Mapping[str, Any]) -> None:
        self.configured.append(settings)
        if isinstance(self.fails, SettingsRefused):
            raise self.fails

    async def discover(self) -> Sequence[Resource]:
        if isinstance(self.fails, HookError):
            raise self.fails
        return self.resources

    def close(self) -> None:
        self.closed = True


@dataclass
class Status:
    name: str
    backend: FakeBackend | None = None
    error: str | None = None


def resource(name: str, serve_through: str | None = "dra") -> Resource:
    return Resource(name=name, devices=(), serve_through=serve_through)  # type: ignore[arg-type]


def config(**values: Any) -> HostConfig:
    return HostConfig.model_validate(values)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[Status]:
    statuses: list[Status] = []
    monkeypatch.setattr(drivers, "load_backends", lambda *_: statuses)
    return statuses


async def test_each_dra_resource_gives_its_driver_to_its_backend(installed: list[Status]) -> None:
    gpu = FakeBackend("gpu", [resource("gpu.example.com/gpu"), resource("gpu.example.com/mig")])
    widget = FakeBackend("widget", [resource("example.com/widget", "device-plugin")], model=False)
    installed += [Status("gpu", gpu), Status("widget", widget)]
    table = await build_table(config(backends={"gpu": {"a": 1}}), {})
    assert table.backends == {"gpu.example.com": gpu}
    assert gpu.configured == [{"a": 1}]
    assert table.problems == ()


async def test_serve_through_and_dra_drivers_of_the_config_are_followed(installed: list[Status]) -> None:
    widget = FakeBackend("widget", [resource("example.com/widget", None)], model=False)
    installed.append(Status("widget", widget))
    table = await build_table(
        config(
            node_name="n",
            serve_through={"widget": "both"},
            dra_drivers={"example.com/widget": "widgets.example.com"},
        ),
        {},
    )
    assert table.backends == {"widgets.example.com": widget}
    assert table.describe() == {"widgets.example.com": "widget (no model: any parameters)"}
    assert widget.bound_to == "n"  # told the node as the host tells it


async def test_a_backend_that_discovers_nothing_checks_the_drivers_named_for_it(
    installed: list[Status],
) -> None:
    broken = FakeBackend("nvidia", fails=HookError("nvidia", "devicehost_discover", "raised NVMLError"))
    installed.append(Status("nvidia", broken))
    table = await build_table(config(), {"nvidia": ("gpu.nvidia.example.com",), "absent": ("x.io",)})
    assert table.backends == {"gpu.nvidia.example.com": broken}
    assert table.problems == ("--driver names backend absent, which is not loaded",)


async def test_failed_backends_and_refused_settings_are_problems_not_drivers(installed: list[Status]) -> None:
    refused = FakeBackend(
        "strict", [resource("s.io/x")], fails=SettingsRefused("strict", ["backends.strict.x: bad"])
    )
    installed += [Status("strict", refused), Status("gone", error="could not be imported")]
    table = await build_table(config(), {})
    assert table.backends == {}
    assert table.problems == (
        "backend gone: could not be imported",
        "backend strict: settings refused: backends.strict.x: bad",
    )


async def test_a_driver_two_backends_claim_stays_with_the_first(installed: list[Status]) -> None:
    first, second = FakeBackend("a", [resource("x.io/one")]), FakeBackend("b", [resource("x.io/two")])
    installed += [Status("a", first), Status("b", second)]
    table = await build_table(config(), {})
    assert table.backends == {"x.io": first}
    assert table.problems == ("driver x.io belongs to backends a and b; a checks it",)
    table.close()
    assert first.closed
    assert second.closed


def test_served_through_dra_follows_resource_then_backend_then_default() -> None:
    cfg = config(node_name="n", serve_through={"b": "dra", "x.io/plugin": "device-plugin"})
    assert served_through_dra(resource("x.io/any", None), "b", cfg)
    assert not served_through_dra(resource("x.io/plugin", "dra"), "b", cfg)
    assert not served_through_dra(resource("x.io/any", None), "other", cfg)
    assert served_through_dra(resource("x.io/any", "both"), "other", cfg)


def test_named_drivers_are_backend_equals_driver() -> None:
    assert parse_named_drivers(["a=x.io", " a = y.io", "b=z.io"]) == {"a": ("x.io", "y.io"), "b": ("z.io",)}
    for bad in ("a", "=x.io", "a="):
        with pytest.raises(ValueError, match="BACKEND=DRIVER"):
            parse_named_drivers([bad])


@pytest.mark.parametrize(
    ("address", "split"),
    [("0.0.0.0:8443", ("0.0.0.0", 8443)), (":9443", ("0.0.0.0", 9443)), ("[::]:443", ("::", 443))],
)
def test_listen_addresses(address: str, split: tuple[str, int]) -> None:
    assert split_address(address) == split


@pytest.mark.parametrize("address", ["8443", "host:", "host:x", "host:70000"])
def test_bad_listen_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_address(address)


async def test_a_configure_hook_that_fails_is_a_problem_not_a_crash(installed: list[Status]) -> None:
    class Unconfigurable(FakeBackend):
        async def configure(self, settings: Mapping[str, Any]) -> None:
            raise HookError(self.name, "devicehost_configure", "raised OSError: no device")

    broken = Unconfigurable("odd", [resource("odd.io/x")])
    installed.append(Status("odd", broken))
    table = await build_table(config(), {"odd": ("odd.io",)})
    assert table.backends == {}
    assert table.problems == ("backend odd: backend 'odd' devicehost_configure raised OSError: no device",)
