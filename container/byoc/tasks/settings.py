"""A training recipe's own hyperparameters, declared by the task that trains with them (`Recipe.recipe_settings`).

byoc.training reads them as it reads its own (byoc.training.hyperparameters: the same decoding, ranges and
messages), keeps those a job gives in `TrainArguments.recipe`, and hands them to the task's `apply_recipe`;
docs/hyperparameters.md's table lists them after byoc's own. Nothing outside the task's place names one: what
training must know of a setting (a step it keeps eager, a job it keeps to one process) is declared with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from byoc.sdk_values import Bound

INT_LIMIT = 2**31 - 1  # the largest whole number a setting takes (a C int: what the libraries underneath hold)
COUNT = Bound(1, INT_LIMIT)  # a positive whole number (byoc.training.arguments' too)


@dataclass(frozen=True)
class RecipeSetting:
    """One hyperparameter of a task's training recipe. `hint`: its type, as a dataclass field's annotation
    (`int | None`); `value`: what the recipe gets of what the job gave (a list of sizes from "768,256"), raising
    ValueError naming what it expects; `eager`: given, the training step is not compiled, and why; `one_process`:
    given, the job trains in one process on a CPU or a GPU (refused on XLA or several processes, saying so)."""

    name: str
    hint: Any
    default: Any
    help: str
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    bound: Bound | None = None
    value: Callable[[Any], Any] | None = None
    eager: str | None = None
    one_process: str | None = None

    def given(self, value: Any) -> Any:
        """What the recipe gets of `value` as the job gave it (ValueError: not such a value)."""
        return self.value(value) if self.value is not None else value


def sizes(value: Any) -> list[int]:
    """Positive whole numbers written as a list ("768,256,64", "[256, 64]"), largest first ([] for none)."""
    parts = [part.strip() for part in str(value or "").strip("[]() ").replace(";", ",").split(",") if part.strip()]
    numbers = sorted({int(part) for part in parts}, reverse=True) if all(p.isdigit() for p in parts) else [0]
    if parts and numbers[-1] < 1:
        raise ValueError("must be a list of vector sizes such as 768,256,64")
    return numbers if parts else []


LORA_R = RecipeSetting(
    "lora_r",
    int | None,
    None,
    "Embedders, generative rerankers: train LoRA adapters of this rank, merged when saved.",
    bound=COUNT,
)
