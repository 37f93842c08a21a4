"""The claim configurations a backend's config model offers as examples
(``host/backends/config_examples.py``): its schema's ``examples``, else the least configuration
its required fields allow, and whether it declares itself inert."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from devicehost.host.backends.config_examples import config_examples, declared_inert, least_config


class Strategy(enum.Enum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class Sharing(BaseModel):
    strategy: Strategy
    replicas: int = 2  # a default: left out


class GpuConfig(BaseModel):
    mode: Literal["exclusive", "shared"]
    sharing: Sharing
    limit: Annotated[float, Field(gt=-1)]
    label: str | None
    devices: list[str]
    name_in_json: bool = Field(alias="nameInJson")


class Declared(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"mode": "a"}, "not a mapping"], "x-devicehost-inert": True}
    )
    mode: str


class Opaque(BaseModel):
    handle: object


def test_the_schema_examples_come_first_and_only_mappings_count() -> None:
    assert config_examples(Declared) == [{"mode": "a"}]
    assert declared_inert(Declared)
    assert not declared_inert(GpuConfig)


def test_without_examples_the_least_config_of_the_required_fields_is_built() -> None:
    built = {
        "mode": "exclusive",  # a Literal's first value
        "sharing": {"strategy": "TimeSlicing"},  # nested: an enum's first member, defaults left out
        "limit": 0.0,
        "label": None,
        "devices": [],
        "nameInJson": False,  # by its alias
    }
    assert config_examples(GpuConfig) == [built]
    assert GpuConfig.model_validate(built).sharing.strategy is Strategy.TIME_SLICING


def test_a_field_with_no_obvious_value_gives_no_example() -> None:
    assert least_config(Opaque) is None
    assert config_examples(Opaque) == []
