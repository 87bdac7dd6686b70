"""A task's training recipe: its rows, tokens, model, collator, loss, metrics, predictions, its own
hyperparameters (byoc.tasks.settings) and how it ranks a corpus. byoc.training reads a task through these members
alone (tests/test_architecture.py); torch, transformers and sentence-transformers are imported where they run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc import model_folder
from byoc.tasks.common import (
    TRANSFORMERS_PROBLEM_TYPES,
    BadParameter,
    Identity,
    kept_rows,
)
from byoc.tasks.settings import RecipeSetting


class Recipe(Identity):
    """The training half of a `Task` (byoc.tasks.base), with a whole-text classifier's defaults."""

    row_unit = "texts"  # what a training row is, for the log
    in_metric_definitions = True  # its metrics are in METRIC_DEFINITIONS (SageMaker reads 40 a job at most)
    smooths_labels = False  # label_smoothing applies (one class per text)
    small_batches = False  # trains at byoc's small default batch whatever the data's size
    masks_rows = False  # its loss cannot skip filler rows itself: byoc masks them (Trainer.compute_loss)
    tunes_thresholds = False  # chooses its decision thresholds on the eval data
    metrics: tuple[str, ...] = ()  # what `evaluate` reports (the log's eval_<name>, METRIC_DEFINITIONS)
    metric_notes: Mapping[str, str] = {}  # metrics.json's notes on metrics whose convention differs
    mined_by: str | None = (
        None  # the task whose model mines its hard negatives (byoc.training.negatives); None: its own
    )
    mines_negatives = False  # its model mines hard negatives (`mine_negatives`); else that refuses, saying why
    evaluates_negatives = False  # an eval split's negative column is kept where train has none (a reranker)
    several_negatives = False  # its rows may hold several negatives (num_negatives): a reranker's become pairs
    recipe_settings: tuple[RecipeSetting, ...] = ()  # its own training recipe's hyperparameters (`apply_recipe`)
    loss_runs_model = False  # its loss embeds the batch's columns itself: the step is never compiled (precision)
    any_columns = False  # its training model takes token columns of any name (**columns): the Trainer keeps them all
    # It ranks a BEIR set's corpus after training (byoc.training.corpus_evaluation): with the evaluator its
    # `corpus_evaluator()` gives, or, where that is None, by reordering an embedding model's top documents
    ranks_corpus = False

    def training_defaults(self, num_labels: int) -> Mapping[str, Any]:
        """Hyperparameters whose default differs for this task on data of `num_labels` labels (measured:
        docs/benchmarks.md); a job that gives one keeps its own value (TrainArguments.for_task)."""
        return {}

    def model_kwargs(self) -> dict[str, Any]:
        """What `from_pretrained` needs to build the task's head (besides the labels): transformers'
        problem_type where the task is one of its own (which picks its loss); a task of another name (a
        plug-in's) leaves it to transformers, which reads it from the labels (config.json's byoc_task
        names the task)."""
        return {"problem_type": self.name} if self.name in TRANSFORMERS_PROBLEM_TYPES else {}

    def configure(self, config: Any, args: Any) -> None:
        """Save in the transformers `config` what serving needs of the job's `args` (TrainArguments)."""

    def head(self, num_labels: int) -> str:
        """The head, for the log."""
        return f"{num_labels} labels ({self.name})"

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """A `datasets.map(batched=True)` function: a batch of the task's rows -> token ids, each row's
        `length` (for the samplers) and `labels`. Texts (and pairs, in `text_pair`) here, cut at max_length.
        A task whose rows can hold words past max_length may add `cut` and `lost` columns: the words no token
        holds, which the room reports and drops."""

        def encode(batch: dict[str, list]) -> dict[str, list]:
            pairs = batch["text_pair"] if "text_pair" in batch else None
            enc = tokenizer(batch["text"], pairs, truncation=True, max_length=max_length, padding=padding)
            enc["length"] = [sum(mask) for mask in enc["attention_mask"]]
            enc["labels"] = batch["label"]
            return enc

        return encode

    def encoding_key(self, tokenizer: Any) -> str:
        """What, beside the tokenizer and the job's settings, decides how `encoder` tokenizes (a multi-vector model's
        folder settings): part of the tokenized data's cache key."""
        return ""

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

        return getattr(transformers, self.auto_class).from_pretrained(
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
        setattr(model.config, model_folder.TASK_KEY, self.name)

    def encoder_of(self, model: Any) -> Any:
        """The transformers model under the trained one (whose bottom layers `freeze_*` freeze)."""
        return model

    def mine_negatives(
        self,
        model: Any,
        anchors: list[str],
        positives: list[str],
        range_min: int,
        range_max: int,
        margin: float,
        count: int = 1,
    ) -> list[list[str]]:
        """Each (anchor, positive) row's hard negatives (`count` at most, hardest first) among the rows' positives,
        mined with `model` (the job's `training_model`, as loaded); none for a row with none in range. BadParameter
        for a task that mines none."""
        raise BadParameter(f"{self.described} trains on no (anchor, positive) rows: there are no negatives to mine")

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """The job's `recipe_settings` (those given) onto its training model; BadParameter for a value it cannot
        train with."""

    def corpus_evaluator(self) -> Any:
        """sentence-transformers' information-retrieval evaluator (a class) that ranks a corpus with its model, or
        None where the model reorders another's top documents (a reranker). Only `ranks_corpus` tasks are asked."""
        raise BadParameter(f"{self.described} does not rank documents for a query")

    def retriever_of(self, model: Any) -> Any:
        """The sentence-transformers model inside the trained one that a retrieval evaluator encodes with
        (`ranks_corpus` tasks only)."""
        raise BadParameter(f"{self.described} does not rank documents for a query")

    def pair_encoding(self, tokenizer: Any, pairs: list[tuple[str, str]], max_length: int) -> dict[str, list]:
        """(query, document) pairs tokenized as the task's model scores them, unpadded (a retrieval set's top 100
        reranked): the tokenizer's pair encoding, cut at `max_length`."""
        return dict(tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation=True, max_length=max_length))

    def takes_mined_negatives(self, columns: list[str], labelled: bool) -> bool:
        """Whether rows of these `columns` (`labelled`: with a score) may get a mined negative each."""
        return self.in_batch_negatives(columns, labelled)

    def pairs_of_rows(self, table: Any, split: str) -> Any:
        """A split's rows as the task trains on them (a reranker's pairs of an embedding model's rows); BadParameter
        for rows it cannot train on."""
        return table

    def in_batch_negatives(self, columns: list[str], labelled: bool) -> bool:
        """Whether training on rows of these `columns` (`labelled`: with a label or score) takes each row's
        negatives from the other rows of its batch, so a batch of one row learns nothing."""
        return False

    def row_loss(self, logits: Any, labels: Any) -> Any:
        """Each row's loss (torch tensors; `masks_rows` tasks only): transformers' loss for the task."""
        raise NotImplementedError(f"{self.name} uses the model's own loss")

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        """The collator that pads a batch of tokenized rows."""
        from transformers import DataCollatorWithPadding  # training's: serving imports tasks without it

        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def with_labels(self, collate: Any, num_labels: int) -> Any:
        """`collate` (padding, or fixed shapes), and whatever turns the rows' labels into the batch's."""
        return collate

    def label_summary(self, labels: np.ndarray) -> str:
        """The train (or eval) labels in a few words, for the log."""
        return f"{len(np.unique(labels))} labels"

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """(metrics, details) of predictions: the Trainer's `logits` against `labels`, filler rows dropped.
        `cut`: a multi-label decision threshold as a logit. Details go to metrics.json, not the log."""
        raise NotImplementedError

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """test_predictions.jsonl's lines, one per row of `logits` (filler rows dropped), in their order;
        `cuts`: a multi-label model's thresholds (one, or one per label) on its scores."""
        logits, labels = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
        return [self.prediction(row, label, names, cuts) for row, label in zip(self.scores(logits), labels)]

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        """One test row's line: its label and the prediction, from its `scores`."""
        best = int(row.argmax())
        return {"label": names[int(label)], "predicted": names[best], "score": round(float(row[best]), 6)}
