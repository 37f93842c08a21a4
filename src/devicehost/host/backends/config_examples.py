"""The claim configurations a backend offers as examples of its claim config model.

A backend names them in its model's JSON schema (``model_config = ConfigDict(json_schema_extra=
{"examples": [...]})``); without examples the least configuration its required fields allow is
built (a ``Literal``'s first value, an enum's first member, nested models likewise, defaults
left out). ``"x-devicehost-inert": true`` beside the examples declares that the configuration
changes nothing a container gets (the conformance rule ``dra-config-used`` then accepts equal
answers). ``devicehost run --simulate-kubelet`` prepares its sample claim with the first example;
the conformance suite prepares every one.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

INERT_KEY = "x-devicehost-inert"
"""The JSON schema key by which a model declares that its configuration changes no answer."""


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    try:
        return model.model_json_schema()
    except Exception:  # a model pydantic cannot describe as JSON schema: no examples, not inert
        return {}


def config_examples(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The ``examples`` of the model's JSON schema, else the least configuration built from its
    required fields; empty when neither gives one (whether the model takes them is not checked)."""
    examples = _schema(model).get("examples")
    if isinstance(examples, list) and any(isinstance(e, dict) for e in examples):
        return [e for e in examples if isinstance(e, dict)]
    built = least_config(model)
    return [] if built is None else [built]


def declared_inert(model: type[BaseModel]) -> bool:
    """Whether the model declares its configuration inert (``"x-devicehost-inert": true``)."""
    return _schema(model).get(INERT_KEY) is True


_NO_VALUE = object()


def least_config(model: type[BaseModel]) -> dict[str, Any] | None:
    """The model's required fields (by alias), each with the least value its type takes; None
    when a field's type gives no obvious value."""
    built: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        value = _least_value(info.annotation)
        if value is _NO_VALUE:
            return None
        built[info.validation_alias if isinstance(info.validation_alias, str) else info.alias or name] = value
    return built


def _least_value(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return typing.get_args(annotation)[0]
    if origin is typing.Annotated:
        return _least_value(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return None if type(None) in args else _least_value(args[0])
    if origin in (list, tuple, set, frozenset, Sequence):
        return []
    if origin in (dict, Mapping):
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, BaseModel):
            nested = least_config(annotation)
            return _NO_VALUE if nested is None else nested
        for kind, value in ((bool, False), (int, 0), (float, 0.0), (str, "")):
            if issubclass(annotation, kind):
                return value
    return _NO_VALUE
