"""Offline metrics and the log lines SageMaker's metric_definitions read."""

import json
import re
import tracemalloc

import numpy as np
import pytest

from byoc.training.metrics import METRIC_DEFINITIONS, classification_metrics, metrics_line, plot_history, write_report


def test_accuracy_and_macro_f1_by_hand():
    labels = np.array([0, 0, 0, 1, 1, 2])
    preds = np.array([0, 0, 1, 1, 2, 2])
    m = classification_metrics(preds, labels, num_labels=3)
    assert m["accuracy"] == pytest.approx(4 / 6)
    # per class F1: c0 p=1 r=2/3 -> 0.8; c1 p=1/2 r=1/2 -> 0.5; c2 p=1/2 r=1 -> 2/3
    assert m["f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert m["f1_weighted"] == pytest.approx((0.8 * 3 + 0.5 * 2 + 2 / 3) / 6)


def test_labels_absent_everywhere_do_not_dilute_macro_f1():
    m = classification_metrics(np.array([0, 1]), np.array([0, 1]), num_labels=5)
    assert m["accuracy"] == 1.0 and m["f1"] == 1.0


def dense_confusion_metrics(predictions, labels, num_labels: int) -> dict[str, float]:
    """The metrics as byoc computed them before issue 21: from a labels-by-labels confusion matrix."""
    confusion = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    true_pos = np.diag(confusion).astype(float)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_pos / predicted, 0.0)
        recall = np.where(actual > 0, true_pos / actual, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    present = (predicted + actual) > 0
    total = max(int(actual.sum()), 1)
    return {
        "accuracy": float(true_pos.sum() / total),
        "f1": float(f1[present].mean()) if present.any() else 0.0,
        "f1_weighted": float((f1 * actual).sum() / total),
        "precision": float(precision[present].mean()) if present.any() else 0.0,
        "recall": float(recall[present].mean()) if present.any() else 0.0,
    }


@pytest.mark.parametrize("num_labels,rows", [(2, 50), (7, 300), (40, 1000), (300, 200), (5, 0)])
def test_same_values_as_the_confusion_matrix(num_labels, rows):
    rng = np.random.default_rng(num_labels)
    labels = rng.integers(0, num_labels, rows)
    predictions = np.where(rng.random(rows) < 0.6, labels, rng.integers(0, num_labels, rows))
    assert classification_metrics(predictions, labels, num_labels) == dense_confusion_metrics(
        predictions, labels, num_labels
    )


def test_memory_grows_with_the_rows_and_labels_not_their_product():
    """100,000 labels: the confusion matrix was 74.5 GiB (MemoryError after training, issue 21)."""
    labels = np.arange(2000) * 50
    predictions = labels.copy()
    predictions[::3] = 7
    tracemalloc.start()
    try:
        metrics = classification_metrics(predictions, labels, num_labels=100_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, peak  # a few arrays of 100,000 numbers
    assert metrics["accuracy"] == pytest.approx(2 / 3, abs=1e-3) and 0 < metrics["f1"] < 1


def test_class_ids_outside_the_labels_are_refused():
    with pytest.raises(ValueError, match="0..2"):
        classification_metrics(np.array([0, 3]), np.array([0, 1]), num_labels=3)
    with pytest.raises(ValueError, match="0..2"):
        classification_metrics(np.array([0, 1]), np.array([-1, 1]), num_labels=3)


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


def test_plot_is_a_png(tmp_path):
    history = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}, {"step": 2, "eval_loss": 0.6, "eval_accuracy": 0.8}]
    plot_history(history, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- multi-label and regression


def test_multilabel_metrics_by_hand():
    from byoc.training.metrics import multilabel_metrics

    truth = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 1]])
    scores = np.array([[0.9, 0.2, 0.1], [0.8, 0.1, 0.7], [0.1, 0.2, 0.3], [0.4, 0.1, 0.6]])
    metrics, per_label = multilabel_metrics(scores, truth, 0.5, ["a", "b", "c"])
    # Predicted: {a}, {a, c}, {}, {c}. a: tp 2; b: fn 1; c: tp 1, fp 1. Pooled tp 3, fp 1, fn 1.
    assert metrics["f1_micro"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert per_label == {"a": 1.0, "b": 0.0, "c": pytest.approx(2 / 3, abs=1e-6)}
    assert metrics["f1_macro"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    # Rows: 1, 2*1/(2+2)=0.5, empty predicted empty = 1, 1.
    assert metrics["f1_samples"] == pytest.approx((1 + 0.5 + 1 + 1) / 4)
    assert metrics["exact_match"] == pytest.approx(3 / 4)
    assert metrics["jaccard"] == pytest.approx((1 + 1 / 3 + 1 + 1) / 4)
    stricter, _ = multilabel_metrics(scores, truth, 0.85, ["a", "b", "c"])
    assert stricter["exact_match"] == pytest.approx(2 / 4)  # only row 0 ({a} at 0.9) and the empty row


def test_regression_metrics_match_the_textbook():
    from byoc.training.metrics import regression_metrics

    rng = np.random.default_rng(0)
    truth = rng.normal(size=50)
    pred = truth + rng.normal(scale=0.5, size=50)
    pred[3] = pred[4]  # a tie for Spearman
    metrics = regression_metrics(pred, truth)
    assert metrics["pearson"] == pytest.approx(np.corrcoef(pred, truth)[0, 1])
    ranks = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731 (no ties but the one)
    tied = ranks(pred)
    tied[[3, 4]] = tied[[3, 4]].mean()
    assert metrics["spearmanr"] == pytest.approx(np.corrcoef(tied, ranks(truth))[0, 1])
    assert metrics["mse"] == pytest.approx(np.mean((pred - truth) ** 2))
    assert metrics["mae"] == pytest.approx(np.mean(np.abs(pred - truth)))
    assert regression_metrics(np.ones(4), truth[:4])["pearson"] == 0.0  # constant predictions: r undefined


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


def test_entities_follow_conlleval_rules():
    from byoc.training.metrics import entities

    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER", "O", "B-X"]
    # An I- after O starts an entity; a B- ends one; a change of type ends one and starts another.
    assert entities(tags) == {("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("PER", 6, 6), ("X", 8, 8)}


def test_token_metrics_by_hand():
    from byoc.training.metrics import token_metrics

    true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-LOC"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-PER", "B-LOC"]]
    metrics, per_type = token_metrics(true, predicted)
    # Gold: PER(0-1), LOC(3), LOC(1:1); predicted: PER(0-1), PER(1:0), LOC(1:1): 2 right of 3 each way.
    assert metrics["precision"] == pytest.approx(2 / 3) and metrics["recall"] == pytest.approx(2 / 3)
    assert metrics["f1"] == pytest.approx(2 / 3) and metrics["accuracy"] == pytest.approx(4 / 6)
    assert per_type == {"LOC": pytest.approx(2 / 3, abs=1e-6), "PER": pytest.approx(2 / 3, abs=1e-6)}


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
