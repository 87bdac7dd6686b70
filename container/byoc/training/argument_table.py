"""docs/hyperparameters.md's table, generated from the hyperparameters byoc reads: `TrainArguments` and every
task's recipe settings (tests/test_readme.py checks it)."""

from __future__ import annotations

from byoc.sdk_values import base_type
from byoc.training.hyperparameters import hyperparameters


def hyperparameter_table() -> str:
    """A Markdown table of every hyperparameter: aliases, default, values allowed, meaning (docs/hyperparameters.md)."""
    rows = ["| name | aliases | default | allowed | meaning |", "|---|---|---|---|---|"]
    for h in hyperparameters():
        aliases = ", ".join(f"`{a}`" for a in h.aliases)
        default = "" if h.default is None else f"`{h.default}`"
        allowed = h.bound.describe() if h.bound else ", ".join(f"`{c}`" for c in h.choices)
        allowed = allowed or ("`true`, `false`" if base_type(h.hint)[0] is bool else "")
        rows.append(f"| `{h.name}` | {aliases} | {default} | {allowed} | {h.help} |")
    return "\n".join(rows)
