"""A reranker trained on lists, as sentence-transformers' CrossEncoder trainer trains one with its listwise losses:
each (query, positive, negatives) row is one list, its documents scored by the cross-encoder together and the
list's order learnt by `LambdaLoss` (NDCG-weighted pairs of the list, the default) or `ListNetLoss` (the list's
softmax against its labels'): `task=listwise_reranker`, `listwise_loss=lambdaloss` or `listnet`.

The rows are the pairwise reranker's (byoc.tasks.reranker): an embedding model's (query, positive[, negatives])
rows, their negatives given or mined (`mine_hard_negatives=true`, `num_negatives` a row); each row's documents
are tokenized as (query, document) pairs, a group of token columns a document (byoc.tasks.listwise_reranker.model),
a row's missing negatives labelled -1 and left out of its list. Evaluated as the pairwise reranker is (its pairs'
accuracy, F1 and average precision), plus the positive's MRR@10 in its list.

Saved and served as the pairwise reranker: a sequence classifier with one output that sentence-transformers'
`CrossEncoder` loads as it is and `byoc serve` serves through TEI's rerank body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.tasks.base import IGNORE_LABEL, BadParameter
from byoc.tasks.reranker import Reranker, RerankerEvaluation, RerankerRecipe, RerankerRows
from byoc.tasks.settings import RecipeSetting

NAME = "listwise_reranker"
LOSSES = ("lambdaloss", "listnet")  # sentence-transformers' LambdaLoss (the default), ListNetLoss
MISSING = -1.0  # a document a row does not have (fewer negatives than the widest row): out of its list


LISTWISE_LOSS = RecipeSetting(
    "listwise_loss", str | None, None, "Listwise rerankers: lambdaloss (default) or listnet.", choices=LOSSES
)


class ListwiseRerankerRows(RerankerRows):
    """The training rows of a listwise reranker (cross-encoder)."""

    row_unit = "(query, documents) lists"
    any_columns = True  # a group of token columns a document: as many as the widest row's list

    def pairs_of_rows(self, table: Any, split: str) -> Any:
        """The rows as they are (a list a row: its positive, then its negatives); scored pairs are refused: a
        list needs a query's several documents."""
        scores = np.asarray(table["label"], dtype=np.float64)
        if np.isfinite(scores).any():
            raise BadParameter(
                f"the {split} rows are scored pairs, and a listwise reranker learns from lists: give (query, "
                "positive[, negatives]) rows (anchor, positive, negative columns), or train task=reranker"
            )
        if split == "train" and not any(c.startswith("text_negative") for c in table.column_names):
            raise BadParameter(
                "the train rows have no negative, and a reranker learns from negatives: set mine_hard_negatives=true "
                "(num_negatives sets how many a row), or add a negative column"
            )
        return table

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        from byoc.tasks.listwise_reranker import model  # (training's: torch)

        return model.list_encoder(tokenizer, max_length, padding)

    def label_summary(self, labels: np.ndarray) -> str:
        values = np.asarray(labels, dtype=np.float64)
        documents = int((values >= 0).sum())
        return f"{len(values)} lists of {documents} documents, {int((values >= 0.5).sum())} of them relevant"


class ListwiseRerankerRecipe(RerankerRecipe):
    """The training recipe of a listwise reranker (cross-encoder)."""

    masks_rows = False  # its model computes the loss, filler rows left out there
    loss_runs_model = True  # its lists' lengths are read in Python: the step is never compiled
    recipe_settings = (LISTWISE_LOSS,)

    def head_summary(self, num_labels: int) -> str:
        return "one relevance logit, a list a row (listwise loss)"

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        from byoc.tasks.listwise_reranker import model  # (as encoder)

        return model.ListCollator(tokenizer, pad_to_multiple_of)

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
        """The pairwise reranker's classifier, under a module that scores a batch's lists and takes their loss."""
        from byoc.tasks.listwise_reranker import model  # (as encoder)

        # One output, as the pairwise reranker's (whose pairs' label column names it): a list's rows have no label
        # column of their own.
        names = label_names or ["label"]
        classifier = super().training_model(path, names, kwargs, overrides, trust_remote_code, max_length, world_size)
        return model.ListwiseModel(classifier)

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        loss = settings.get("listwise_loss") or LOSSES[0]
        if loss not in LOSSES:
            raise BadParameter(f"listwise_loss={loss!r}: one of {', '.join(LOSSES)}")
        model.use(loss)

    def encoder_of(self, model: Any) -> Any:
        return model.classifier

    def describe(self, model: Any, args: Any, pairs: bool | None) -> None:
        super().describe(model.classifier, args, True)  # (the folder written is the classifier's: it reads pairs)


class ListwiseRerankerEvaluation(RerankerEvaluation):
    """The evaluation of a listwise reranker (cross-encoder)."""

    metrics = (*RerankerEvaluation.metrics, "mrr_at_10")

    def retriever_of(self, model: Any) -> Any:
        return model.classifier  # the cross-encoder: it scores the pairs an embedding model retrieved

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The pairwise reranker's metrics over every listed document, and the positive's MRR@10 in its list."""
        logits, labels = _lists(logits, labels)
        listed = labels >= 0
        metrics, _ = super().evaluate(logits[listed].reshape(-1, 1), labels[listed].reshape(-1, 1), names, cut)
        # the listed negatives scored at or above the positive (column 0): a tie counts against it, so that a model
        # that scores every document alike is not ranked perfect
        ahead = ((logits >= logits[:, :1]) & listed)[:, 1:].sum(axis=1)
        rank = ahead + 1
        metrics["mrr_at_10"] = float(np.where(rank <= 10, 1.0 / rank, 0.0).mean()) if len(rank) else 0.0
        return metrics, {}

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """Each test row's documents: their labels and probabilities (the sigmoid CrossEncoder.predict applies)."""
        logits, labels = _lists(logits, labels)
        lines = []
        for row, label in zip(logits, labels):
            listed = label >= 0
            scores = 1 / (1 + np.exp(-row[listed].astype(np.float64)))
            lines.append({"labels": label[listed].round(6).tolist(), "scores": scores.round(6).tolist()})
        return lines


class ListwiseReranker(Reranker):
    name = NAME
    aliases = ("reranker_listwise", "listwise_cross_encoder")
    described = "a listwise reranker (cross-encoder)"
    rows_class = ListwiseRerankerRows
    recipe_class = ListwiseRerankerRecipe
    evaluation_class = ListwiseRerankerEvaluation


def _lists(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The evaluated lists without filler rows; documents an evaluation padded (with IGNORE_LABEL) are missing."""
    logits, labels = np.asarray(logits, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    logits, labels = logits.reshape(len(logits), -1), labels.reshape(len(labels), -1)
    keep = labels[:, 0] != IGNORE_LABEL
    labels = np.where(labels == IGNORE_LABEL, MISSING, labels)[keep]
    return logits[keep], labels
