"""DRA's CEL: the ``device`` a DeviceClass or request selector sees, evaluated with celpy.

A selector (``device.attributes["gpu.example.com"].index == 1``) is compiled once by
:func:`compile_selector` and asked of each device with :meth:`Selector.matches`. The ``device``
variable is the one Kubernetes gives: ``driver``, ``attributes`` and ``capacity`` by domain (a
domain the device lacks is an empty map, an unqualified name is in the driver's domain), and
``allowMultipleAllocations``. Capacities are quantities and ``version`` attributes semvers, with
Kubernetes' functions of both (``quantity("1Gi")``, ``compareTo``, ``isGreaterThan``, ``add``,
``asInteger``, ``semver("1.2.3")``, ``major`` ...). A selector that fails to compile, fails at run
time (a missing attribute) or gives no bool raises :class:`SelectorError`, as the scheduler's does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from devicehost import quantity as quantities

__all__ = ["Quantity", "Selector", "SelectorError", "Semver", "compile_selector", "device_variable"]


class SelectorError(ValueError):
    """A CEL selector that does not compile, fails when evaluated, or gives no bool."""


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """A Kubernetes quantity in CEL (``device.capacity[...]``, ``quantity("1Gi")``)."""

    value: Decimal

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Semver:
    """A semantic version in CEL (a ``version`` attribute, ``semver("1.2.3")``)."""

    major: int
    minor: int
    patch: int
    pre: str = ""

    @classmethod
    def parse(cls, text: str) -> Semver:
        found = _SEMVER.fullmatch(text)
        if found is None:
            raise SelectorError(f"{text!r:.100} is not a semantic version")
        return cls(int(found[1]), int(found[2]), int(found[3]), found[4] or "")

    def _key(self) -> tuple[int, int, int, int, str]:
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, self.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __lt__(self, other: Semver) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(quantities.parse(str(text)))
    except ValueError as exc:
        raise SelectorError(str(exc)) from None


def _is_quantity(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(quantities.PATTERN.fullmatch(str(text)) is not None)


def _is_semver(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER.fullmatch(str(text)) is not None)


def _compare(a: Any, b: Any) -> celtypes.IntType:
    if type(a) is not type(b) or not isinstance(a, Quantity | Semver):
        raise SelectorError(f"compareTo: no overload for {type(a).__name__} and {type(b).__name__}")
    return celtypes.IntType((a > b) - (a < b))


def _amount(value: Any) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int):
        return Decimal(value)
    raise SelectorError(f"not a quantity or an int: {value!r:.100}")


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value != q.value.to_integral_value():
        raise SelectorError(f"asInteger: {q.value} is not an integer")
    return celtypes.IntType(int(q.value))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": lambda text: Semver.parse(str(text)),
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "add": lambda a, b: Quantity(_amount(a) + _amount(b)),
    "sub": lambda a, b: Quantity(_amount(a) - _amount(b)),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "isInteger": lambda q: celtypes.BoolType(q.value == q.value.to_integral_value()),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "major": lambda v: celtypes.IntType(v.major),
    "minor": lambda v: celtypes.IntType(v.minor),
    "patch": lambda v: celtypes.IntType(v.patch),
}
"""Kubernetes' quantity and semver functions (a method ``a.f(b)`` is called as ``f(a, b)``)."""


class _Domains(celtypes.MapType):
    """Attributes or capacities by domain: a domain the device lacks is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self:
            return celtypes.MapType()
        return super().__getitem__(key)


def _attribute(value: Mapping[str, Any]) -> Any:
    kind, raw = next(iter(value.items()))
    if kind == "version":
        return Semver.parse(str(raw))
    return json_to_cel(raw)


def _by_domain(driver: str, entries: Mapping[str, Any], convert: Callable[[Any], Any]) -> _Domains:
    domains: dict[str, dict[celtypes.StringType, Any]] = {}
    for name, value in entries.items():
        domain, _, short = name.rpartition("/")
        domains.setdefault(domain or driver, {})[celtypes.StringType(short)] = convert(value)
    return _Domains({celtypes.StringType(d): celtypes.MapType(v) for d, v in domains.items()})


def device_variable(driver: str, device: Mapping[str, Any]) -> celtypes.MapType:
    """The ``device`` a selector sees of one published ``device`` (a slice's entry) of ``driver``."""
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): _by_domain(driver, device.get("attributes") or {}, _attribute),
            celtypes.StringType("capacity"): _by_domain(
                driver, device.get("capacity") or {}, lambda c: _quantity(c["value"])
            ),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                bool(device.get("allowMultipleAllocations"))
            ),
        }
    )


@dataclass(frozen=True)
class Selector:
    """One compiled CEL selector."""

    expression: str
    program: celpy.Runner

    def matches(self, device: celtypes.MapType) -> bool:
        """Whether the ``device`` (:func:`device_variable`) is selected.

        :raises SelectorError: the expression failed at run time or gave no bool.
        """
        try:
            result = self.program.evaluate({"device": device})
        except (CELEvalError, SelectorError, TypeError, ValueError) as exc:
            raise SelectorError(f"CEL runtime error: {_said(exc)}") from None
        if isinstance(result, CELEvalError):
            raise SelectorError(f"CEL runtime error: {_said(result)}")
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(f"must evaluate to bool, got {type(result).__name__}")
        return bool(result)


def _said(exc: Exception) -> str:
    """What went wrong: a function's own error where celpy wrapped one (its third argument)."""
    if len(exc.args) == 3 and isinstance(exc.args[2], tuple) and exc.args[2]:
        return str(exc.args[2][0])
    return str(exc.args[0]) if exc.args else type(exc).__name__


_ENVIRONMENT = celpy.Environment()


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """The ``expression`` compiled with DRA's functions.

    :raises SelectorError: it does not compile, saying where.
    """
    try:
        tree = _ENVIRONMENT.compile(expression)
    except CELParseError as exc:
        where = str(exc).splitlines()
        raise SelectorError(f"compilation failed: {where[0] if where else expression}") from None
    return Selector(expression, _ENVIRONMENT.program(tree, functions=FUNCTIONS))
