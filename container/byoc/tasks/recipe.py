"""A task's training recipe: its model and head, its own hyperparameters (byoc.tasks.settings), the collator, the
loss, what config.json keeps for serving. byoc.training reads a task's recipe through these members alone
(tests/test_architecture.py); torch and transformers are imported where they run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byoc import model_folder
from byoc.tasks.common import (
    TRANSFORMERS_PROBLEM_TYPES,
    Part,
)
from byoc.tasks.settings import RecipeSetting


class Recipe(Part):
    """The training recipe of a `Task` (byoc.tasks.base), with a whole-text classifier's defaults."""

    smooths_labels = False  # label_smoothing applies (one class per text)
    small_batches = False  # trains at byoc's small default batch whatever the data's size
    masks_rows = False  # its loss cannot skip filler rows itself: byoc masks them (Trainer.compute_loss)
    recipe_settings: tuple[RecipeSetting, ...] = ()  # its own training recipe's hyperparameters (`apply_recipe`)
    loss_runs_model = False  # its loss embeds the batch's columns itself: the step is never compiled (precision)

    def training_defaults(self, num_labels: int) -> Mapping[str, Any]:
        """Hyperparameters whose default differs for this task on data of `num_labels` labels (measured:
        docs/benchmarks.md); a job that gives one keeps its own value (TrainArguments.for_task)."""
        return {}

    def model_kwargs(self) -> dict[str, Any]:
        """What `from_pretrained` needs to build the task's head (besides the labels): transformers'
        problem_type where the task is one of its own (which picks its loss); a task of another name (a
        plug-in's) leaves it to transformers, which reads it from the labels (config.json's byoc_task
        names the task)."""
        return {"problem_type": self.task.name} if self.task.name in TRANSFORMERS_PROBLEM_TYPES else {}

    def configure(self, config: Any, args: Any) -> None:
        """Save in the transformers `config` what serving needs of the job's `args` (TrainArguments)."""

    def head_summary(self, num_labels: int) -> str:
        """The head, for the log."""
        return f"{num_labels} labels ({self.task.name})"

    def training_model(
        self,
        path: str,
        label_names: list[str],
        kwargs: dict[str, Any],
        overrides: dict[str, Any],
        trust_remote_code: bool,
        max_length: int,
        world_size: int,
    ) -> Any:
        """The model to train from the folder at `path`, its head for `label_names`: `kwargs` for from_pretrained
        (the task's `model_kwargs`, precision, attention), `overrides` for its config (dropout); inputs up to
        `max_length` tokens, trained by `world_size` processes."""
        import transformers  # training's: serving imports tasks without it

        return getattr(transformers, self.task.auto_class).from_pretrained(
            path,
            num_labels=len(label_names),
            id2label=dict(enumerate(label_names)),
            label2id={name: i for i, name in enumerate(label_names)},
            # A classifier fine-tuned earlier on other labels gets a fresh head instead of an error.
            ignore_mismatched_sizes=True,
            trust_remote_code=trust_remote_code,
            **overrides,
            **kwargs,
        )

    def describe(self, model: Any, args: Any, pairs: bool | None) -> None:
        """Write into the trained model's config.json what serving needs: the job's settings (`configure`),
        whether it read pairs, and the task's name (whatever problem_type says)."""
        self.configure(model.config, args)
        if pairs is not None:  # (serving answers rerank requests only where the model read pairs)
            setattr(model.config, model_folder.PAIRS_KEY, pairs)
        setattr(model.config, model_folder.TASK_KEY, self.task.name)

    def encoder_of(self, model: Any) -> Any:
        """The transformers model under the trained one (whose bottom layers `freeze_*` freeze)."""
        return model

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """The job's `recipe_settings` (those given) onto its training model; BadParameter for a value it cannot
        train with."""

    def row_loss(self, logits: Any, labels: Any) -> Any:
        """Each row's loss (torch tensors; `masks_rows` tasks only): transformers' loss for the task."""
        raise NotImplementedError(f"{self.task.name} uses the model's own loss")

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        """The collator that pads a batch of tokenized rows."""
        from transformers import DataCollatorWithPadding  # training's: serving imports tasks without it

        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def with_labels(self, collate: Any, num_labels: int) -> Any:
        """`collate` (padding, or fixed shapes), and whatever turns the rows' labels into the batch's."""
        return collate
