"""Offline metrics and the log lines SageMaker's metric_definitions read."""

import re

import numpy as np
import pytest

from byoc.metrics import METRIC_DEFINITIONS, classification_metrics, metrics_line, plot_history


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
