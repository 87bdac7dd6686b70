"""A task's training rows: what a row of its data is, how its rows are tokenized (and cached), how they become
pairs or lists, and the negatives they take (mined, or the batch's other rows). byoc.training reads a task's rows
through these members alone (tests/test_architecture.py); the libraries are imported where they run."""

from __future__ import annotations

from typing import Any

import numpy as np

from byoc.tasks.common import (
    BadParameter,
    Part,
)


class Rows(Part):
    """The rows a `Task` (byoc.tasks.base) trains on, with a whole-text classifier's defaults."""

    row_unit = "texts"  # what a training row is, for the log
    mined_by: str | None = (
        None  # the task whose model mines its hard negatives (byoc.training.negatives); None: its own
    )
    mines_negatives = False  # its model mines hard negatives (`mine_negatives`); else that refuses, saying why
    evaluates_negatives = False  # an eval split's negative column is kept where train has none (a reranker)
    several_negatives = False  # its rows may hold several negatives (num_negatives): a reranker's become pairs
    any_columns = False  # its training model takes token columns of any name (**columns): the Trainer keeps them all

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
        raise BadParameter(
            f"{self.task.described} trains on no (anchor, positive) rows: there are no negatives to mine"
        )

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

    def label_summary(self, labels: np.ndarray) -> str:
        """The train (or eval) labels in a few words, for the log."""
        return f"{len(np.unique(labels))} labels"
