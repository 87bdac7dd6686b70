"""Several labels per text: a sigmoid per label, binary cross-entropy, decision thresholds (one for every
label, and labels' own: byoc.tasks.thresholds) saved in config.json, micro/macro/samples F1."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder
from byoc.tasks.base import IGNORE_LABEL, Task, kept_rows, sigmoid
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.recipe import Recipe
from byoc.tasks.rows import Rows

NAME = "multi_label_classification"


class MultiLabelHead(Head):
    """The serving head of a multi-label classifier."""

    parameters = ("threshold", "top_k")

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The decision thresholds training chose (config.json's byoc_threshold and byoc_thresholds)."""
        return {"threshold": model_folder.threshold_of(config), "thresholds": model_folder.thresholds_of(config)}

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """The labels at or above the threshold, best first (at most top_k); top_k alone: the k best,
        whatever their scores."""
        top_k, threshold = parameters.get("top_k"), parameters.get("threshold")
        cuts = label_cuts(model, threshold)
        results: list[Any] = []
        for row in scores:
            best = np.argsort(-row, kind="stable")
            if threshold is not None or not top_k:
                best = best[row[best] >= np.broadcast_to(cuts, row.shape)[best]]
            results.append([{"label": id2label[int(j)], "score": float(row[j])} for j in best[:top_k]])
        return results


class MultiLabelRows(Rows):
    """The training rows of a multi-label classifier."""

    def label_summary(self, labels: np.ndarray) -> str:
        per_row = np.array([len(row) for row in labels])  # each row's label ids
        used = len(np.unique(np.concatenate([*labels, np.array([], dtype=np.int32)])))
        return f"multi-label, {used} labels used, {per_row.mean() if len(per_row) else 0:.2f} per row"


class MultiLabelRecipe(Recipe):
    """The training recipe of a multi-label classifier."""

    masks_rows = True
    # 1 epoch, micro / macro F1: 10,667 rows of joined emotion tweets 0.652 / 0.426 at batch 32 (rare labels never
    # predicted; a plain Trainer 0.703 / 0.400), 0.856 / 0.683 at 16; semeval2018-ec 0.613 / 0.400 -> 0.628 / 0.419.
    small_batches = True

    def configure(self, config: Any, args: Any) -> None:
        """The decision threshold (unset: 0.5 until chosen on eval data); a byoc model trained again forgets
        its old labels' own thresholds."""
        threshold = model_folder.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
        setattr(config, model_folder.THRESHOLD_KEY, threshold)
        vars(config).pop(model_folder.THRESHOLDS_KEY, None)

    def row_loss(self, logits: Any, labels: Any) -> Any:
        import torch  # training's: the slim serving image has no torch

        return torch.nn.functional.binary_cross_entropy_with_logits(
            logits.float(), labels.float().clamp(min=0), reduction="none"
        ).mean(dim=1)

    def with_labels(self, collate: Any, num_labels: int) -> Any:
        return MultiHot(collate, num_labels)


class MultiLabelEvaluation(Evaluation):
    """The evaluation of a multi-label classifier."""

    tunes_thresholds = True
    metrics = ("f1_micro", "f1_macro", "f1_samples", "exact_match", "jaccard")
    metric_notes = {
        "f1_samples": "each row's F1, averaged; a row with no true label predicted none counts 1 (SemEval's "
        "convention; scikit-learn's f1_score(average='samples') counts it 0)",
        "f1_macro": "averaged over the labels present in the data or the predictions",
    }

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        logits, labels = kept_rows(logits, labels)
        metrics, per_label = multilabel_metrics(logits, labels, cut, names)
        return metrics, {"f1_per_label": per_label}

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        cuts = np.broadcast_to(cuts, row.shape)  # one threshold, or each label's own
        return {
            "labels": [names[j] for j in np.flatnonzero(label >= 0.5)],
            "predicted": [names[j] for j in np.argsort(-row, kind="stable") if row[j] >= cuts[j]],
            "scores": {name: round(float(v), 6) for name, v in zip(names, row)},
        }


class MultiLabel(Task):
    name = NAME
    aliases = ("multi_label", "multilabel", "multi")
    described = "a multi-label classifier"
    head_class = MultiLabelHead
    rows_class = MultiLabelRows
    recipe_class = MultiLabelRecipe
    evaluation_class = MultiLabelEvaluation

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits)


def label_cuts(model: Mapping, threshold: float | None) -> float | np.ndarray:
    """The score each label needs: the request's threshold; else the label's own, where training chose one
    (`thresholds`, NaN for the others: byoc.model_folder.thresholds_of); else the model's `threshold`."""
    overall = model.get("threshold", model_folder.DEFAULT_THRESHOLD) if threshold is None else threshold
    own = model.get("thresholds") if threshold is None else None
    return overall if own is None else np.where(np.isnan(np.asarray(own, dtype=np.float64)), overall, own)


def multilabel_metrics(
    scores: np.ndarray, labels: np.ndarray, threshold: float | np.ndarray, names: list[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """(metrics, per-label F1) of multi-label predictions: `scores` at or above `threshold` (sigmoid scores,
    or logits against the threshold's logit; one for every label or one per label) against 0/1 `labels`,
    both (rows, labels).

    f1_micro pools every label's counts; f1_macro averages the labels that occur in the data or the
    predictions (as for one label per text); f1_samples averages each row's F1, a row with no labels
    that is predicted none counting 1 (SemEval's convention; scikit-learn counts it 0); exact_match:
    rows predicted exactly; jaccard: each row's |predicted & true| / |predicted | true|, averaged."""
    predicted = np.asarray(scores) >= threshold
    truth = np.asarray(labels) >= 0.5
    true_pos = (predicted & truth).sum(axis=0).astype(float)
    n_pred, n_true = predicted.sum(axis=0), truth.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_label = np.where(n_pred + n_true > 0, 2 * true_pos / (n_pred + n_true), 0.0)
        row_tp = (predicted & truth).sum(axis=1)
        row_sum = predicted.sum(axis=1) + truth.sum(axis=1)
        row_f1 = np.where(row_sum > 0, 2 * row_tp / row_sum, 1.0)
        union = (predicted | truth).sum(axis=1)
        row_jaccard = np.where(union > 0, row_tp / union, 1.0)
    present = (n_pred + n_true) > 0
    pooled = n_pred.sum() + n_true.sum()
    metrics = {
        "f1_micro": float(2 * true_pos.sum() / pooled) if pooled else 1.0,
        "f1_macro": float(per_label[present].mean()) if present.any() else 1.0,
        "f1_samples": float(row_f1.mean()) if len(row_f1) else 0.0,
        "exact_match": float((predicted == truth).all(axis=1).mean()) if len(truth) else 0.0,
        "jaccard": float(row_jaccard.mean()) if len(row_jaccard) else 0.0,
    }
    return metrics, {name: round(float(f), 6) for name, f in zip(names, per_label)}


class MultiHot:
    """A multi-label collator: each row's label ids (how the data holds them, byoc.training.data.task_choice) become
    the batch's 0/1 rows here, batch by batch, after `collate` built the rest; filler rows (a fixed-shape
    batch's) at IGNORE_LABEL, which the masked loss skips."""

    def __init__(self, collate: Any, num_labels: int) -> None:
        self.collate, self.num_labels = collate, num_labels

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch  # training's: the slim serving image has no torch

        ids = [feature["labels"] for feature in features]
        batch = self.collate([{k: v for k, v in feature.items() if k != "labels"} for feature in features])
        labels = torch.full((len(batch["input_ids"]), self.num_labels), float(IGNORE_LABEL), dtype=torch.float32)
        labels[: len(ids)] = 0.0
        for row, columns in enumerate(ids):
            labels[row, torch.as_tensor(columns, dtype=torch.long)] = 1.0
        batch["labels"] = labels
        return batch
