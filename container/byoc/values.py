"""A hyperparameter value as one of SageMaker's SDKs encoded it, decoded against a Python type.

Each SDK writes `hyperparameters.json` differently (`byoc.arguments` lists how); these functions take
any of those encodings: JSON first, then the raw string.
"""

from __future__ import annotations

import json
import math
import typing
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
