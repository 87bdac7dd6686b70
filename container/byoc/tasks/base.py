"""What every task is (`Task`), with the defaults of a classifier of whole texts.

A task is the kind of answer a model gives for a text: a class, several labels, a number, a tag per
token. Each is one module of this package holding one `Task`: its identity (its names, how messages name
it, the transformers class its folder loads as, its graph's outputs) and its four parts, each an interface
of its own: the serving head (`task.head`: byoc.tasks.head), and the training rows, recipe and evaluation
(`task.rows`, `task.recipe`, `task.evaluation`). The rooms ask the task's parts, never compare its name:
adding a task is a new module here (and its registry line in `byoc.tasks`), plus its tests.

Only NumPy is imported at the top: serving imports every task, also in the slim image, which has no
torch, transformers or pandas; the training-only parts import them where they run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc.tasks.common import (  # noqa: F401  (re-exported: the tasks import them from here)
    IGNORE_LABEL,
    TRANSFORMERS_PROBLEM_TYPES,
    BadParameter,
    activated,
    check_pairs,
    kept_rows,
    sigmoid,
    softmax,
    trained_on_pairs,
)
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.recipe import Recipe
from byoc.tasks.rows import Rows


class Task:
    """One task: its identity and model folder here, its parts each an interface of its own, made with it from
    the classes it names (a family's own, or the defaults). The class attributes are its facts; the methods
    have a whole-text classifier's defaults."""

    name: str = ""  # canonical, as config.json's problem_type holds it (transformers' names)
    aliases: tuple[str, ...] = ()  # what users may write for `task`
    described: str = ""  # "a single-label classifier": how answers and errors name it
    # Files a model folder of it holds beside the encoder's (FlagEmbedding's heads): such a folder is its.
    folder_files: tuple[str, ...] = ()
    trains = True  # a job trains it (task=<name>); False: served only, a job refuses it
    auto_class = "AutoModelForSequenceClassification"  # the transformers class that loads it
    output_axes: Mapping[int, str] = {0: "batch"}  # the graph's output's dynamic axes (model.onnx's "logits")
    sentence_model_type: str | None = None  # the sentence-transformers folders it serves (their model_type)
    sentence_module: str | None = None  # a module type (class name) that makes a sentence-transformers folder its
    head_class: type[Head] = Head  # what byoc serve computes from the model's outputs
    rows_class: type[Rows] = Rows  # the training data's rows, tokens and negatives
    recipe_class: type[Recipe] = Recipe  # the model, loss, collator and hyperparameters a job trains with
    evaluation_class: type[Evaluation] = Evaluation  # metrics, predictions, corpus ranking

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A member of a part defined on the task itself is refused: no room would ask the task for it."""
        super().__init_subclass__(**kwargs)
        for name in vars(cls):
            part = next((p for p in (Head, Rows, Recipe, Evaluation) if name in vars(p)), None)
            if part is not None and not name.startswith("__"):
                raise TypeError(
                    f"{cls.__name__} defines {name} on the task: it is the {part.__name__.lower()}'s "
                    f"({part.__module__}.{part.__name__}); define it on a subclass of {part.__name__} that the task "
                    f"names as its {part.__name__.lower()}_class"
                )

    def __init__(self) -> None:
        self.head = self.head_class(self)
        self.rows = self.rows_class(self)
        self.recipe = self.recipe_class(self)
        self.evaluation = self.evaluation_class(self)

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """(the transformers model saved in `model_dir`, the weights it lacks: a head initialised at random)."""
        import transformers  # serving's torch path and the export: the slim image never calls this

        model, loading = getattr(transformers, self.auto_class).from_pretrained(
            model_dir, output_loading_info=True, **kwargs
        )
        return model, list(loading["missing_keys"])

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """A torch module: feeds (input_ids, attention_mask...) in, the served output (`scores`' input) out.
        What model.onnx holds, and what serving's torch path runs."""
        import torch  # (as load_torch)

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.config = model.config

            def forward(self, **feeds: torch.Tensor) -> torch.Tensor:
                return self.model(**feeds).logits

        return Logits().eval()

    def tokenizer_problem(self, fast: bool) -> str | None:
        """Why the model's tokenizer (`fast`: a tokenizer.json's) cannot serve or train the task; None where it can."""
        return None

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """What the model's answer reports, from its logits (a distribution over the labels by default)."""
        return softmax(np.asarray(logits))
