"""byoc.tasks.regression: its metrics."""

import numpy as np
import pytest


def test_regression_metrics_match_the_textbook():
    from byoc.tasks.regression import regression_metrics

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
