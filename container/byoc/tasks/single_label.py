"""One class per text (or sentence pair): softmax over the labels, cross-entropy, accuracy and F1."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc.tasks.base import Task, check_pairs, kept_rows, trained_on_pairs
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.recipe import Recipe

NAME = "single_label_classification"


class SingleLabelHead(Head):
    """The serving head of a single-label classifier."""

    parameters = ("top_k",)

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        return {"pairs": trained_on_pairs(config)}

    def check_rerank(self, model: Mapping) -> None:
        if len(model.get("id2label") or {}) != 2:
            super().check_rerank(model)
        check_pairs(self.task, model)

    def relevance(self, row: np.ndarray, raw: bool, model: Mapping) -> float:
        """Two labels: the probability of the second (the relevant one: label 1), or its logit odds."""
        if len(row) != 2:
            return super().relevance(row, raw, model)
        if raw:
            return float(np.log(max(row[1], 1e-300)) - np.log(max(row[0], 1e-300)))
        return float(row[1])

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """The best {"label", "score"}, or the top_k of them best first."""
        top_k = parameters.get("top_k")
        results: list[Any] = []
        for row in scores:
            best = np.argsort(-row, kind="stable")
            entries = [{"label": id2label[int(j)], "score": float(row[j])} for j in best[: top_k or 1]]
            results.append(entries if top_k else entries[0])
        return results


class SingleLabelRecipe(Recipe):
    """The training recipe of a single-label classifier."""

    smooths_labels = True


class SingleLabelEvaluation(Evaluation):
    """The evaluation of a single-label classifier."""

    metrics = ("accuracy", "f1", "f1_weighted", "precision", "recall")

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        logits, labels = kept_rows(logits, labels)
        return classification_metrics(np.argmax(logits, axis=-1), labels, len(names)), {}


class SingleLabel(Task):
    name = NAME
    aliases = ("single_label", "single", "classification")
    described = "a single-label classifier"
    head_class = SingleLabelHead
    recipe_class = SingleLabelRecipe
    evaluation_class = SingleLabelEvaluation


def classification_metrics(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """Accuracy, macro F1 (`f1`), weighted F1 and macro precision/recall from class ids."""
    predictions, labels = _class_ids(predictions, num_labels), _class_ids(labels, num_labels)
    # Per-class counts in O(N + L) memory: a labels-by-labels confusion matrix is 74.5 GiB at 100,000 labels.
    true_pos = np.bincount(labels[predictions == labels], minlength=num_labels).astype(float)
    predicted = np.bincount(predictions, minlength=num_labels)
    actual = np.bincount(labels, minlength=num_labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_pos / predicted, 0.0)
        recall = np.where(actual > 0, true_pos / actual, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    # Macro averages over the labels that occur in the data or the predictions (as scikit-learn does).
    present = (predicted + actual) > 0
    total = max(int(actual.sum()), 1)
    return {
        "accuracy": float(true_pos.sum() / total),
        "f1": float(f1[present].mean()) if present.any() else 0.0,
        "f1_weighted": float((f1 * actual).sum() / total),
        "precision": float(precision[present].mean()) if present.any() else 0.0,
        "recall": float(recall[present].mean()) if present.any() else 0.0,
    }


def _class_ids(values: np.ndarray, num_labels: int) -> np.ndarray:
    ids = np.asarray(values).reshape(-1).astype(np.int64, copy=False)
    if ids.size and not (0 <= ids.min() and ids.max() < num_labels):
        raise ValueError(f"class ids must be in 0..{num_labels - 1}, got {ids.min()}..{ids.max()}")
    return ids
