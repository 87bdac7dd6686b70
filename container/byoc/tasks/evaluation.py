"""A task's evaluation: its metrics (the log's, METRIC_DEFINITIONS'), how a model's predictions are scored, the
test predictions file, and how it ranks a corpus (a retrieval set). byoc.training reads a task's evaluation
through these members alone (tests/test_architecture.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.tasks.common import (
    BadParameter,
    Part,
    kept_rows,
)


class Evaluation(Part):
    """How a `Task` (byoc.tasks.base) is evaluated, with a whole-text classifier's defaults."""

    in_metric_definitions = True  # its metrics are in METRIC_DEFINITIONS (SageMaker reads 40 a job at most)
    tunes_thresholds = False  # chooses its decision thresholds on the eval data
    metrics: tuple[str, ...] = ()  # what `evaluate` reports (the log's eval_<name>, METRIC_DEFINITIONS)
    metric_notes: Mapping[str, str] = {}  # metrics.json's notes on metrics whose convention differs
    # It ranks a BEIR set's corpus after training (byoc.training.corpus_evaluation): with the evaluator its
    # `corpus_evaluator()` gives, or, where that is None, by reordering an embedding model's top documents
    ranks_corpus = False

    def corpus_evaluator(self) -> Any:
        """sentence-transformers' information-retrieval evaluator (a class) that ranks a corpus with its model, or
        None where the model reorders another's top documents (a reranker). Only `ranks_corpus` tasks are asked."""
        raise BadParameter(f"{self.task.described} does not rank documents for a query")

    def retriever_of(self, model: Any) -> Any:
        """The sentence-transformers model inside the trained one that a retrieval evaluator encodes with
        (`ranks_corpus` tasks only)."""
        raise BadParameter(f"{self.task.described} does not rank documents for a query")

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
        return [self.prediction(row, label, names, cuts) for row, label in zip(self.task.scores(logits), labels)]

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        """One test row's line: its label and the prediction, from its `scores`."""
        best = int(row.argmax())
        return {"label": names[int(label)], "predicted": names[best], "score": round(float(row[best]), 6)}
