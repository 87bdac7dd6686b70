"""Reading the training job's hyperparameters (byoc.training.arguments' dataclass), decoded the same
whichever SDK wrote them.

`hyperparameters.json` is a flat string -> string map, but each SDK encodes values differently:
- SageMaker SDK v2 `Estimator` without `source_dir`: `str(v)`, so `True` -> "True", 5e-5 -> "5e-05",
  ['a'] -> "['a']";
- framework estimators and anything with `source_dir`: `json.dumps(v)`, so strings arrive quoted;
- SDK v3 `ModelTrainer`: strings raw, everything else `json.dumps`.
`parse_hyperparameters` accepts all three by decoding each value against the type of its field
(JSON first, then the raw string), so "True", "true", "1" and true all mean True, and '"bert"' and
'bert' both mean bert. Names follow the public tutorials and
`run_glue.py`; aliases map to one canonical field. Keys SageMaker adds (`sagemaker_*`) are kept
apart for the launcher. Anything else unknown is an error that suggests the closest name.
"""

from __future__ import annotations

import difflib
import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from byoc import tasks
from byoc.sdk_values import Bound, base_type, coerce, describe
from byoc.tasks.settings import RecipeSetting
from byoc.training.arguments import HyperparameterError, TrainArguments, own_fields

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter as it is read, checked and listed: byoc's own (a TrainArguments field) or a task's
    recipe setting (`recipe`: kept in TrainArguments.recipe)."""

    name: str
    hint: Any
    default: Any
    help: str
    aliases: tuple[str, ...]
    choices: tuple[str, ...]
    bound: Bound | None
    recipe: RecipeSetting | None = None


def hyperparameters() -> list[Hyperparameter]:
    """Every hyperparameter `byoc train` reads: byoc's own, then every task's recipe settings."""
    hints = typing.get_type_hints(TrainArguments)
    own = [
        Hyperparameter(
            f.name,
            hints[f.name],
            f.default,
            f.metadata["help"],
            f.metadata["aliases"],
            f.metadata["choices"],
            f.metadata["bound"],
        )
        for f in own_fields()
    ]
    recipes = [
        Hyperparameter(r.name, r.hint, r.default, r.help, r.aliases, r.choices, r.bound, r)
        for r in tasks.recipe_settings().values()
    ]
    return own + recipes


def _names() -> dict[str, Hyperparameter]:
    """Every accepted name (canonical and alias) -> its hyperparameter."""
    names = {}
    for h in hyperparameters():
        for name in (h.name, *h.aliases):
            names[name] = h
    return names


def parse_hyperparameters(raw: Mapping[str, Any]) -> TrainArguments:
    """Decode a hyperparameters.json mapping (any SDK's encoding) into `TrainArguments`."""
    names = _names()
    values: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in raw.items():
        if key.startswith("sagemaker_"):  # what the SDK adds (region, container log level...): not ours
            continue
        name = key.lstrip("-").replace("-", "_")
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
            raise HyperparameterError(
                f"unknown hyperparameter {key!r}: {f'did you mean {close[0]!r}? ' if close else ''}"
                "See the hyperparameter table (docs/hyperparameters.md) for the valid names"
            )
        canonical = names[name].name
        decoded = _decode(key, value, names[name])
        if canonical in values and values[canonical] != decoded:
            raise HyperparameterError(
                f"hyperparameters {given_as[canonical]}={values[canonical]!r} and {key}={decoded!r} set the "
                f"same setting ({canonical}) differently: keep one"
            )
        values[canonical], given_as[canonical] = decoded, key
    recipe = {name: values.pop(name) for name in list(values) if names[name].recipe is not None}
    args = TrainArguments(**values, recipe=recipe)
    _check_mining(args)
    if args.output_dir:
        logger.info("output_dir=%s is ignored: the model is written to SM_MODEL_DIR", args.output_dir)
    return args


def _check_mining(args: TrainArguments) -> None:
    """mine_hard_negatives=true with a task set whose negatives nothing mines: refused before any data is read."""
    if not args.mine_hard_negatives or args.task not in tasks.TASKS:
        return
    task = tasks.get(args.task)
    if not tasks.get(task.rows.mined_by or task.name).rows.mines_negatives:
        try:
            task.rows.mine_negatives(None, [], [], 0, 1, 0.0)  # (its refusal, which says why)
        except tasks.BadParameter as err:
            raise HyperparameterError(f"hyperparameters task={args.task} and mine_hard_negatives=true: {err}") from None


def given_names(raw: Mapping[str, Any]) -> frozenset[str]:
    """The canonical names of the hyperparameters `raw` (hyperparameters.json) gives: the others take their
    defaults, where a task's may differ from byoc's (`TrainArguments.for_task`)."""
    names = _names()
    return frozenset(names[n].name for n in (k.lstrip("-").replace("-", "_") for k in raw) if n in names)


def _decode(key: str, value: Any, h: Hyperparameter) -> Any:
    kind, optional = base_type(h.hint)
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))):
        return None
    try:
        decoded = coerce(value, kind)
    except (ValueError, TypeError):
        raise HyperparameterError(f"hyperparameter {key} must be {describe(kind)}, got {value!r}") from None
    if h.choices and decoded not in h.choices:
        raise HyperparameterError(f"hyperparameter {key} must be one of {', '.join(h.choices)}, got {decoded!r}")
    if h.recipe is not None:
        try:
            h.recipe.given(decoded)  # (a recipe's own reading of it: a list of sizes...) fails here, before any work
        except ValueError as err:
            raise HyperparameterError(f"hyperparameter {key} {err}, got {value!r}") from None
    return decoded
