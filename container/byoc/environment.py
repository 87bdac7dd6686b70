"""The one reader of the environment: typed, checked values from a mapping of variables (`os.environ`
by default). Each program reads its variables through it once, at start, into its settings
(`byoc.launch.settings`, `byoc.training.settings`, `byoc.serving.settings`, the /opt/ml contract in
`byoc.contract`) and passes them down; docs/settings.md lists every variable.

An empty variable counts as unset (the project's rule: `FOO=` in an environment map restores the
default). A value of the wrong kind or out of its range raises `SettingError` (or the subclass a
program names) with the variable, the value and what is allowed, so that the program stops at start
with that message instead of failing later, or never.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from byoc.errors import UserError

D = TypeVar("D")
T = TypeVar("T")

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class SettingError(UserError, ValueError):
    """A variable the program cannot run with: the message names it, its value and what is allowed."""


class Environment:
    """Typed views of the variables in `env` (`os.environ` when None); bad values raise `error`."""

    def __init__(self, env: Mapping[str, str] | None = None, error: type[Exception] = SettingError) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.error = error

    def raw(self, name: str) -> str | None:
        """The value without surrounding spaces; None when unset or empty."""
        return (self.env.get(name) or "").strip() or None

    def is_set(self, name: str) -> bool:
        return self.raw(name) is not None

    def text(self, name: str) -> str | None:
        """The value as it is (spaces trimmed); None when unset."""
        return self.raw(name)

    def path(self, name: str) -> Path | None:
        value = self.raw(name)
        return None if value is None else Path(value)

    def integer(self, name: str, default: D, minimum: int, maximum: int | None = None) -> int | D:
        """A whole number from `minimum` to `maximum` (no upper bound when None)."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value: int | None = int(raw)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
            raise self.error(f"{name}={raw!r}: must be a whole number {bound}{_default(default)}")
        return value

    def number(self, name: str, default: D, minimum: float = 0.0, positive: bool = False) -> float | D:
        """A finite number of at least `minimum` (greater than 0 where `positive`)."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (positive and value <= 0):
            bound = "greater than 0" if positive else "0 or more" if minimum == 0 else f"of at least {minimum:g}"
            raise self.error(f"{name}={raw!r}: must be a number {bound}{_default(default)}")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        raw = self.raw(name)
        if raw is None:
            return default
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
        raise self.error(f"{name}={raw!r}: use 1 or 0 (or true/false, yes/no, on/off)")

    def choice(self, name: str, default: str, choices: Sequence[str]) -> str:
        """One of `choices`, matched without regard to case; returned as `choices` spells it."""
        raw = self.raw(name)
        if raw is None:
            return default
        found = next((c for c in choices if c.lower() == raw.lower()), None)
        if found is None:
            listed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
            raise self.error(f"{name}={raw!r}: use {listed}")
        return found

    def parsed(self, name: str, parse: Callable[[str], T], expected: str) -> T | None:
        """`parse(value)`, for a syntax of its own; `expected` says what a value looks like."""
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            return parse(raw)
        except ValueError:
            raise self.error(f"{name}={raw!r}: must be {expected}") from None


def _default(default: object) -> str:
    if default is None:
        return " (unset by default)"
    return f" (default {default:g})" if isinstance(default, float) else f" (default {default})"


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child process: this process's, with `extra` set."""
    return {**os.environ, **extra}
