"""Offline metrics and the log lines SageMaker's metric_definitions read."""

import json
import re

import numpy as np
import pytest

from byoc.training.metrics import METRIC_DEFINITIONS, metrics_line, plot_history, write_report


def test_metric_definitions_read_the_log_lines():
    train = metrics_line(
        {"step": 50, "epoch": 0.5, "loss": 0.4321, "learning_rate": 4.5e-05, "samples_per_second": 101.5}
    )
    evaluation = metrics_line({"step": 100, "epoch": 1.0, "eval_loss": 0.25, "eval_accuracy": 0.9125, "eval_f1": 0.875})
    found = {}
    for definition in METRIC_DEFINITIONS:
        for line in (train, evaluation):
            match = re.search(definition["Regex"], line)
            if match:
                found.setdefault(definition["Name"], float(match.group(1)))
    assert found == {
        "train:loss": 0.4321,
        "train:learning_rate": 4.5e-05,
        "train:samples_per_second": 101.5,
        "train:epoch": 0.5,
        "eval:loss": 0.25,
        "eval:accuracy": 0.9125,
        "eval:f1": 0.875,
    }


def test_a_retrieval_models_definitions_read_its_retrieval_set_figures_and_every_tasks_fit_in_forty():
    from byoc import tasks
    from byoc.training.metrics import metric_definitions

    final = metrics_line({"test_corpus_ndcg_at_10": 0.61, "test_bm25_ndcg_at_10": 0.42, "eval_mrr_at_10": 0.5})
    for task in (tasks.EMBEDDING, tasks.SPARSE_EMBEDDING):
        found = {
            d["Name"]: float(match.group(1))
            for d in metric_definitions(task)
            if (match := re.search(d["Regex"], final))
        }
        assert found == {"test:corpus_ndcg_at_10": 0.61, "test:bm25_ndcg_at_10": 0.42, "eval:mrr_at_10": 0.5}
    for task in (None, *tasks.TASKS):
        assert len(metric_definitions(task)) <= 40, task  # SageMaker's limit a job
    assert not any("corpus" in d["Name"] for d in METRIC_DEFINITIONS)  # classifiers rank no corpus


def test_plot_is_a_png(tmp_path):
    history = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}, {"step": 2, "eval_loss": 0.6, "eval_accuracy": 0.8}]
    plot_history(history, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- multi-label and regression


def test_task_metrics_drop_the_filler_rows_of_fixed_shape_batches():
    from transformers import EvalPrediction

    from byoc.training.metrics import TaskMetrics

    logits = np.array([[4.0, -4.0], [-4.0, 4.0], [4.0, 4.0]])
    labels = np.array([[1.0, 0.0], [0.0, 1.0], [-100.0, -100.0]])  # the last row is filler
    metrics = TaskMetrics("multi_label_classification", ["x", "y"])(EvalPrediction(logits, labels))
    assert metrics["exact_match"] == 1.0
    value = TaskMetrics("regression", ["score"])(
        EvalPrediction(np.array([[1.0], [2.0], [9.0]]), np.array([1.0, 2.0, -100.0]))
    )
    assert value["mse"] == 0.0 and value["pearson"] == pytest.approx(1.0)


def test_metrics_json_is_strict_json_whatever_the_metrics(tmp_path):
    """NaN and infinity (Pearson of constant predictions, a loss that overflowed) are not JSON: strict parsers
    refuse a metrics.json holding them. They are written as null."""
    summary = {"eval_loss": float("inf"), "eval_pearson": float("nan"), "test_f1": np.float32("nan"), "ok": 0.5}
    history = [{"step": 1, "loss": float("-inf")}, {"step": 2, "eval_loss": np.float64(1.5)}]
    path = write_report(tmp_path, summary, history)

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    report = json.loads(path.read_text(), parse_constant=refuse)
    assert report["eval_loss"] is None and report["eval_pearson"] is None and report["test_f1"] is None
    assert report["ok"] == 0.5
    assert report["history"] == [{"step": 1, "loss": None}, {"step": 2, "eval_loss": 1.5}]
