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
from transformers import TrainerCallback

from byoc import tasks
from byoc.model_folder import DEFAULT_THRESHOLD
from byoc.tasks import thresholds
from byoc.tasks.base import kept_rows
from byoc.training.corpus_evaluation import DEFINED as CORPUS_DEFINED

logger = logging.getLogger(__name__)

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
# Every metric an evaluation can report: the loss, and each task's (byoc.tasks: `Evaluation.metrics`).
EVALUATED = ("loss", *dict.fromkeys(name for task in tasks.TASKS.values() for name in task.evaluation.metrics))
# Multi-label metrics also reported at the thresholds chosen on the eval data (byoc.tasks.thresholds),
# as `eval_f1_micro_tuned`...; the others at those thresholds go to metrics.json only.
TUNED = ("f1_micro", "f1_macro")
SPLITS = ("eval", "test")  # the prefixes of an evaluation's metrics (`eval_loss`, `test_f1`...)
_TRAINING = [
    {"Name": "train:loss", "Regex": rf"\[metrics\].* loss={_NUMBER}"},
    {"Name": "train:learning_rate", "Regex": rf"\[metrics\].* learning_rate={_NUMBER}"},
    {"Name": "train:samples_per_second", "Regex": rf"\[metrics\].* samples_per_second={_NUMBER}"},
    {"Name": "train:epoch", "Regex": rf"\[metrics\].* epoch={_NUMBER}"},
]


def metric_definitions(task: str | None = None) -> list[dict[str, str]]:
    """For `Estimator(metric_definitions=...)`: each regex reads one `[metrics]` log line field. SageMaker
    takes at most 40 a job: `task` (a byoc.tasks name) gives one task's; None every classifier's and
    regression's (38: `METRIC_DEFINITIONS`). An embedding model's: metric_definitions("embedding")."""
    kinds = (
        [tasks.get(task)] if task else [kind for kind in tasks.TASKS.values() if kind.evaluation.in_metric_definitions]
    )
    names = ("loss", *dict.fromkeys(name for kind in kinds for name in kind.evaluation.metrics))
    if any(
        kind.evaluation.ranks_corpus for kind in kinds
    ):  # a BEIR set's headline figures (byoc.training.corpus_evaluation)
        names = (*names, *CORPUS_DEFINED)
    tuned = TUNED if any(kind.evaluation.tunes_thresholds for kind in kinds) else ()
    return _TRAINING + [
        {"Name": f"{split}:{name}", "Regex": rf"\[metrics\].* {split}_{name}={_NUMBER}"}
        for split in SPLITS
        for name in (*names, *(f"{name}_tuned" for name in tuned))
    ]


METRIC_DEFINITIONS: list[dict[str, str]] = metric_definitions()


class TaskMetrics:
    """The Trainer's `compute_metrics` for a task; `details` keeps the last evaluation's per-label
    figures (per-label F1), which go to metrics.json rather than into every log line.

    A multi-label task with `threshold` None is scored at 0.5 and, with `choosing`, each evaluation
    also chooses thresholds on what it scores (`tuned`: the eval data's, byoc.tasks.thresholds);
    once chosen, every evaluation also reports its metrics at them (`..._tuned`)."""

    def __init__(self, task: str, names: list[str], threshold: float | None = 0.5, choosing: bool = False) -> None:
        self.task, self.names = tasks.get(task), names
        self.threshold = DEFAULT_THRESHOLD if threshold is None else threshold
        self.choosing = choosing and self.task.evaluation.tunes_thresholds and threshold is None
        self.tuned: thresholds.Thresholds | None = None
        self.details: dict[str, Any] = {}

    def __call__(self, prediction: Any) -> dict[str, float]:
        return self.compute_metrics(prediction)

    def compute_metrics(self, prediction: Any) -> dict[str, float]:
        """(The name byoc.errors reads on a traceback: out of memory here is "computing the metrics".)"""
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        logits, labels = np.asarray(logits), np.asarray(prediction.label_ids)
        # sigmoid(x) >= t exactly where x >= logit(t): multi-label logits are compared as they are, with no
        # float64 copy of a (rows, labels) matrix.
        metrics, self.details = self.task.evaluation.evaluate(
            logits, labels, self.names, float(thresholds.logit(self.threshold))
        )
        if not (self.choosing or self.tuned):
            return metrics
        logits, labels = kept_rows(logits, labels)
        if self.choosing:
            self.tuned = thresholds.choose(logits, labels, self.names)
        return {**metrics, **self._tuned(logits, labels)}

    def _tuned(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The metrics at the chosen thresholds: TUNED for the log line, the rest in `details`."""
        if self.tuned is None:
            return {}
        metrics, details = self.task.evaluation.evaluate(logits, labels, self.names, self.tuned.cuts(self.names))
        rest = {key: value for key, value in metrics.items() if key not in TUNED}
        self.details["tuned"] = {**rest, **details}
        return {f"{key}_tuned": metrics[key] for key in TUNED}


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
    report = strict({**_noting_present(summary), "history": history})
    path.write_text(json.dumps(report, indent=2, default=_jsonable, allow_nan=False) + "\n")
    try:
        plot_history(history, output_data_dir / "metrics.png")
    except Exception as err:  # a plot must never fail a finished job
        logger.warning("could not draw metrics.png: %s", err)
    return path


def _noting_present(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` with `metric_notes` (a task's notes on its metrics' conventions) on the metrics it reports
    only (an embedding model's retrieval note where its eval data were scored pairs: none), or without it."""
    notes = summary.get("metric_notes")
    if not isinstance(notes, dict):
        return summary
    present = {name: note for name, note in notes.items() if any(f"{split}_{name}" in summary for split in SPLITS)}
    kept = {key: present if key == "metric_notes" else value for key, value in summary.items()}
    return kept if present else {key: value for key, value in kept.items() if key != "metric_notes"}


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
