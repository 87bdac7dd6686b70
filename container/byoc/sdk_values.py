"""A hyperparameter value as one of SageMaker's SDKs encoded it, decoded against a Python type, and
the range a number must be in.

Each SDK writes `hyperparameters.json` differently (`byoc.training.arguments` lists how); these functions take
any of those encodings: JSON first, then the raw string.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import dataclass
from typing import Any


def loads(value: Any) -> Any:
    """JSON first (framework estimators, v3), else the raw string (v2 `str(v)`)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def coerce(value: Any, kind: type) -> Any:
    """`value` as `kind` (bool, int, float or str); ValueError or TypeError when it is not one."""
    if kind is str:
        parsed = loads(value)
        # A quoted JSON string (framework estimators) is unquoted; anything else keeps its raw text,
        # so a v3 raw "1.0" or "123" stays exactly what the user typed.
        return parsed if isinstance(parsed, str) else (value if isinstance(value, str) else json.dumps(value))
    parsed = loads(value)
    if isinstance(parsed, str):
        parsed = parsed.strip()
    if kind is bool:
        if isinstance(parsed, bool):
            return parsed
        if isinstance(parsed, (int, float)) and parsed in (0, 1):
            return bool(parsed)
        if isinstance(parsed, str) and parsed.lower() in ("true", "yes", "y", "on", "t"):
            return True
        if isinstance(parsed, str) and parsed.lower() in ("false", "no", "n", "off", "f"):
            return False
        raise ValueError(value)
    if kind is int:
        if isinstance(parsed, bool):
            raise TypeError(value)
        number = float(parsed) if isinstance(parsed, str) else parsed
        if isinstance(number, float) and not number.is_integer():
            raise ValueError(value)
        return int(number)
    if kind is float:
        if isinstance(parsed, bool):
            raise TypeError(value)
        number = float(parsed)
        if not math.isfinite(number):
            raise ValueError(value)
        return number
    raise TypeError(kind)


def base_type(hint: Any) -> tuple[type, bool]:
    """`int | None` -> (int, True)."""
    args = typing.get_args(hint)
    if args and type(None) in args:
        inner = [a for a in args if a is not type(None)][0]
        return (typing.get_origin(inner) or inner), True
    return (typing.get_origin(hint) or hint), False


_KINDS = {bool: "a boolean (true/false, True/False or 1/0)", int: "an integer", float: "a number", str: "a string"}


def describe(kind: type) -> str:
    return _KINDS.get(kind, kind.__name__)


@dataclass(frozen=True)
class Bound:
    """The numbers a setting accepts: from `low` to `high` (None: no limit), each end included unless open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        """`greater than 0`, `at least 1`, `from 0 to 4294967295`, `in [0, 1)`."""
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            return f"greater than {low}" if self.low_open else f"at least {low}"
        if self.low is None:
            return f"less than {high}" if self.high_open else f"at most {high}"
        if not (self.low_open or self.high_open):
            return f"from {low} to {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else str(int(value or 0))
