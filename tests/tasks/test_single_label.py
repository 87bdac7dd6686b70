"""byoc.tasks.single_label: accuracy and F1 from class ids."""

import tracemalloc

import numpy as np
import pytest

from byoc.tasks.single_label import classification_metrics


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
