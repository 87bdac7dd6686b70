"""Metrics computed offline, log lines SageMaker can scrape, and the job's metrics report.

The Hub-hosted `evaluate` modules cannot be fetched in network-isolated jobs, so accuracy and
F1 are computed here with numpy. Progress and metrics are logged as `key=value` lines that the
regexes in `METRIC_DEFINITIONS` read (pass them as `Estimator(metric_definitions=...)`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from transformers import TrainerCallback

from byoc.model_folder import DEFAULT_THRESHOLD, MULTI_LABEL, REGRESSION, TOKEN_CLASSIFICATION
from byoc.training import thresholds
from byoc.training.buckets import IGNORE_LABEL

logger = logging.getLogger(__name__)

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
# Every metric an evaluation can report, by task: one label per text (accuracy..recall; NER reports
# precision, recall, f1 and accuracy over entities and tokens), several (f1_micro..jaccard), a number
# (pearson..mae).
EVALUATED = (
    "loss",
    "accuracy",
    "f1",
    "f1_weighted",
    "precision",
    "recall",
    "f1_micro",
    "f1_macro",
    "f1_samples",
    "exact_match",
    "jaccard",
    "pearson",
    "spearmanr",
    "mse",
    "mae",
)
# Multi-label metrics also reported at the thresholds chosen on the eval data (byoc.training.thresholds),
# as `eval_f1_micro_tuned`...; the others at those thresholds go to metrics.json only.
TUNED = ("f1_micro", "f1_macro")
# For `Estimator(metric_definitions=METRIC_DEFINITIONS)`: each regex reads one `[metrics]` log line field.
# 38 definitions: SageMaker takes at most 40 per job, so every task's metrics fit in one list.
METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": "train:loss", "Regex": rf"\[metrics\].* loss={_NUMBER}"},
    {"Name": "train:learning_rate", "Regex": rf"\[metrics\].* learning_rate={_NUMBER}"},
    {"Name": "train:samples_per_second", "Regex": rf"\[metrics\].* samples_per_second={_NUMBER}"},
    {"Name": "train:epoch", "Regex": rf"\[metrics\].* epoch={_NUMBER}"},
] + [
    {"Name": f"{split}:{name}", "Regex": rf"\[metrics\].* {split}_{name}={_NUMBER}"}
    for split in ("eval", "test")
    for name in (*EVALUATED, *(f"{name}_tuned" for name in TUNED))
]


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


# What metrics.json says of the metrics whose convention differs between libraries (`metric_notes`).
METRIC_NOTES = {
    MULTI_LABEL: {
        "f1_samples": "each row's F1, averaged; a row with no true label predicted none counts 1 (SemEval's "
        "convention; scikit-learn's f1_score(average='samples') counts it 0)",
        "f1_macro": "averaged over the labels present in the data or the predictions",
    },
}


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


def regression_metrics(predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation, mean squared and mean absolute error."""
    pred = np.asarray(predictions, dtype=np.float64).reshape(-1)
    true = np.asarray(targets, dtype=np.float64).reshape(-1)
    return {
        "pearson": _correlation(pred, true),
        # Spearman: Pearson of the ranks, ties sharing their average rank (pandas ranks as scipy does).
        "spearmanr": _correlation(pd.Series(pred).rank().to_numpy(), pd.Series(true).rank().to_numpy()),
        "mse": float(np.mean((pred - true) ** 2)) if len(pred) else 0.0,
        "mae": float(np.mean(np.abs(pred - true))) if len(pred) else 0.0,
    }


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r; 0 where either side is constant (r is undefined there)."""
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """The (type, first, last) entity chunks of an IOB tag sequence, as seqeval's default mode (the
    conlleval script's rules) reads them: a chunk ends at O, at a B-, or where the type changes; an
    I- after O or after another type starts one."""
    found, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        bi, this = (tag[0], tag[2:]) if tag != "O" else ("O", None)
        if kind is not None and (bi in ("O", "B") or this != kind):
            found.add((kind, start, i - 1))
            kind = None
        if bi != "O" and (bi == "B" or kind is None):
            kind, start = this, i
    return found


def token_metrics(true: list[list[str]], predicted: list[list[str]]) -> tuple[dict[str, float], dict[str, float]]:
    """(metrics, per-type F1) of tag sequences: entity-level precision, recall and F1 pooled over
    every entity (seqeval's micro average), and token accuracy."""
    gold = {(row, *e) for row, tags in enumerate(true) for e in entities(tags)}
    guess = {(row, *e) for row, tags in enumerate(predicted) for e in entities(tags)}
    hit = gold & guess
    kinds = sorted({e[1] for e in gold | guess})
    per_type = {}
    for kind in kinds:
        g, p, h = (sum(e[1] == kind for e in group) for group in (gold, guess, hit))
        per_type[kind] = round(2 * h / (g + p), 6) if g + p else 0.0
    precision = len(hit) / len(guess) if guess else 0.0
    recall = len(hit) / len(gold) if gold else 0.0
    tokens = sum(len(t) for t in true)
    metrics = {
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "accuracy": sum(a == b for t, p in zip(true, predicted) for a, b in zip(t, p)) / tokens if tokens else 0.0,
    }
    return metrics, per_type


def tag_sequences(logits: np.ndarray, labels: np.ndarray, names: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """(true, predicted) tag names of each row, at the positions that carry a label (a word's first
    sub-token; never padding or special tokens, which hold IGNORE_LABEL)."""
    predicted_ids = np.asarray(logits).argmax(axis=-1)
    true, predicted = [], []
    for row, ids in zip(labels, predicted_ids):
        keep = np.flatnonzero(row != IGNORE_LABEL)
        true.append([names[int(row[k])] for k in keep])
        predicted.append([names[int(ids[k])] for k in keep])
    return true, predicted


class TaskMetrics:
    """The Trainer's `compute_metrics` for a task; `details` keeps the last evaluation's per-label
    figures (per-label F1), which go to metrics.json rather than into every log line.

    A multi-label task with `threshold` None is scored at 0.5 and, with `choosing`, each evaluation
    also chooses thresholds on what it scores (`tuned`: the eval data's, byoc.training.thresholds);
    once chosen, every evaluation also reports its metrics at them (`..._tuned`)."""

    def __init__(self, task: str, names: list[str], threshold: float | None = 0.5, choosing: bool = False) -> None:
        self.task, self.names = task, names
        self.threshold = DEFAULT_THRESHOLD if threshold is None else threshold
        self.choosing = choosing and task == MULTI_LABEL and threshold is None
        self.tuned: thresholds.Thresholds | None = None
        self.details: dict[str, Any] = {}

    def __call__(self, prediction: Any) -> dict[str, float]:
        return self.compute_metrics(prediction)

    def compute_metrics(self, prediction: Any) -> dict[str, float]:
        """(The name byoc.errors reads on a traceback: out of memory here is "computing the metrics".)"""
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        logits, labels = np.asarray(logits), np.asarray(prediction.label_ids)
        if self.task == TOKEN_CLASSIFICATION:  # a label per token: padding and filler rows hold IGNORE_LABEL
            metrics, per_type = token_metrics(*tag_sequences(logits, labels, self.names))
            self.details = {"f1_per_type": per_type}
            return metrics
        # Score against the label ids returned with the predictions, never the dataset's column:
        # the evaluation order need not be the dataset's. Filler rows (fixed-shape batches) are dropped.
        keep = labels.reshape(len(labels), -1)[:, 0] != IGNORE_LABEL
        if not keep.all():  # (a copy only where there are filler rows: multi-label logits can be GBs)
            logits, labels = logits[keep], labels[keep]
        if self.task == MULTI_LABEL:
            # sigmoid(x) >= t exactly where x >= logit(t): the logits are compared as they are, with no
            # float64 copy of a (rows, labels) matrix.
            metrics, per_label = multilabel_metrics(logits, labels, float(thresholds.logit(self.threshold)), self.names)
            self.details = {"f1_per_label": per_label}
            if self.choosing:
                self.tuned = thresholds.choose(logits, labels, self.names)
            return {**metrics, **self._tuned(logits, labels)}
        if self.task == REGRESSION:
            return regression_metrics(logits, labels)
        return classification_metrics(np.argmax(logits, axis=-1), labels, len(self.names))

    def _tuned(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The metrics at the chosen thresholds: TUNED for the log line, the rest in `details`."""
        if self.tuned is None:
            return {}
        metrics, per_label = multilabel_metrics(logits, labels, self.tuned.cuts(self.names), self.names)
        rest = {key: value for key, value in metrics.items() if key not in TUNED}
        self.details["tuned"] = {**rest, "f1_per_label": per_label}
        return {f"{key}_tuned": metrics[key] for key in TUNED}


def _class_ids(values: np.ndarray, num_labels: int) -> np.ndarray:
    ids = np.asarray(values).reshape(-1).astype(np.int64, copy=False)
    if ids.size and not (0 <= ids.min() and ids.max() < num_labels):
        raise ValueError(f"class ids must be in 0..{num_labels - 1}, got {ids.min()}..{ids.max()}")
    return ids


def metrics_line(values: dict[str, Any], tag: str = "metrics") -> str:
    """`[metrics] step=100 epoch=0.25 loss=0.4321 ...`: one line, stable keys, SageMaker-scrapable.
    The job's closing summary is tagged `[final]`: it repeats the last evaluation, which the metric
    definitions (they read `[metrics]` lines) must count once."""
    parts = []
    for key, value in values.items():
        if isinstance(value, float):
            value = f"{value:.6g}" if math.isfinite(value) else str(value)
        parts.append(f"{key}={value}")
    return f"[{tag}] " + " ".join(parts)


class ProgressCallback(TrainerCallback):
    """Readable progress and metric lines in place of tqdm bars (which CloudWatch shows as noise)."""

    def __init__(self, samples_per_step: int) -> None:
        self.samples_per_step = samples_per_step
        self._start = self._last_time = 0.0
        self._last_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = self._last_time = time.monotonic()
        self._last_step = state.global_step
        if state.is_world_process_zero:
            logger.info("training: %d steps, %d samples per step", state.max_steps, self.samples_per_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        logs_in, logs = logs, dict(logs)
        line: dict[str, Any] = {"step": state.global_step, "epoch": round(state.epoch or 0.0, 4)}
        if "loss" in logs and "train_runtime" not in logs:
            now = time.monotonic()
            steps = state.global_step - self._last_step
            rate = steps * self.samples_per_step / max(now - self._last_time, 1e-9)
            self._last_time, self._last_step = now, state.global_step
            left = (state.max_steps - state.global_step) * self.samples_per_step / max(rate, 1e-9)
            if isinstance(logs_in, dict):  # the callbacks after this one (TensorBoard, MLflow) report it too
                logs_in["samples_per_second"] = round(rate, 2)
            line.update(
                loss=float(logs["loss"]),
                learning_rate=float(logs.get("learning_rate", 0.0)),
                samples_per_second=round(rate, 2),
                progress=f"{100 * state.global_step / max(state.max_steps, 1):.0f}%",
                eta=_duration(left),
            )
        else:
            line.update({k: v for k, v in logs.items() if isinstance(v, (int, float)) and k != "epoch"})
        logger.info(metrics_line(line))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def write_report(output_data_dir: Path, summary: dict[str, Any], history: list[dict[str, Any]]) -> Path:
    """Write `metrics.json` (final metrics + per-step history) and `metrics.png` (loss and eval curves)."""
    output_data_dir.mkdir(parents=True, exist_ok=True)
    path = output_data_dir / "metrics.json"
    report = strict({**summary, "history": history})
    path.write_text(json.dumps(report, indent=2, default=_jsonable, allow_nan=False) + "\n")
    try:
        plot_history(history, output_data_dir / "metrics.png")
    except Exception as err:  # a plot must never fail a finished job
        logger.warning("could not draw metrics.png: %s", err)
    return path


def strict(value: Any) -> Any:
    """`value` with every NaN or infinity as null: metrics.json is strict JSON (RFC 8259 has neither), which
    every parser reads; a metric that is not a number (Pearson of constant predictions) is null there."""
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def plot_history(history: list[dict[str, Any]], path: Path) -> None:
    """Training loss, eval loss and eval accuracy / F1 against the step."""
    # Only for the plot at the job's end: matplotlib's import costs a second.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): pyplot picks its backend when imported

    train = [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]
    evals = [h for h in history if "eval_loss" in h and "step" in h]
    fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot(*zip(*train), label="train loss")
    if evals:
        ax_loss.plot([h["step"] for h in evals], [h["eval_loss"] for h in evals], "o-", label="eval loss")
        for key in ("eval_accuracy", "eval_f1", "eval_f1_micro", "eval_pearson"):
            points = [(h["step"], h[key]) for h in evals if key in h]
            if points:
                ax_score.plot(*zip(*points), "o-", label=key)
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_score.set(xlabel="step", ylabel="score", title="evaluation")
    for ax in (ax_loss, ax_score):
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
