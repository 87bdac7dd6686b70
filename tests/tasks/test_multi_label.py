"""byoc.tasks.multi_label: its metrics."""

import numpy as np
import pytest


def test_multilabel_metrics_by_hand():
    from byoc.tasks.multi_label import multilabel_metrics

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
