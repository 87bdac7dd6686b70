"""docs/hyperparameters.md's table, generated from `TrainArguments` (tests/test_readme.py checks it)."""

from __future__ import annotations

import dataclasses
import typing

from byoc.sdk_values import base_type
from byoc.training.arguments import TrainArguments


def hyperparameter_table() -> str:
    """A Markdown table of every hyperparameter: aliases, default, values allowed, meaning (docs/hyperparameters.md)."""
    rows = ["| name | aliases | default | allowed | meaning |", "|---|---|---|---|---|"]
    hints = typing.get_type_hints(TrainArguments)
    for f in dataclasses.fields(TrainArguments):
        aliases = ", ".join(f"`{a}`" for a in f.metadata["aliases"])
        default = "" if f.default is None else f"`{f.default}`"
        bound, choices = f.metadata["bound"], f.metadata["choices"]
        allowed = bound.describe() if bound else ", ".join(f"`{c}`" for c in choices)
        allowed = allowed or ("`true`, `false`" if base_type(hints[f.name])[0] is bool else "")
        rows.append(f"| `{f.name}` | {aliases} | {default} | {allowed} | {f.metadata['help']} |")
    return "\n".join(rows)
