"""Choosing a multi-label model's decision thresholds on eval data: a global one by micro F1, a label's
own where it has enough positives and its own raises micro F1, and the metrics at them."""

from __future__ import annotations

import numpy as np
from transformers import PretrainedConfig

from byoc import model_folder, tasks
from byoc.tasks import thresholds
from byoc.tasks.thresholds import MIN_POSITIVES, Thresholds, choose, logit
from byoc.training.metrics import TaskMetrics


def rows_scored(positive: list[float], negative: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """One label's column: the positives' and negatives' sigmoid scores as logits, and 0/1 labels."""
    scores = np.asarray(positive + negative)
    return logit(scores).astype(np.float32), np.asarray([1.0] * len(positive) + [0.0] * len(negative))


def test_the_global_threshold_is_where_micro_f1_is_best_not_half():
    """Positives score 0.31-0.4, negatives 0.05-0.14: at 0.5 nothing is predicted; anything from 0.15 to 0.3
    is perfect, and the middle of the tied best is taken."""
    rng = np.random.default_rng(0)
    logits, labels = rows_scored(list(rng.uniform(0.31, 0.4, 8)), list(rng.uniform(0.05, 0.14, 30)))
    chosen = choose(logits[:, None], labels[:, None], ["joy"])
    assert chosen.overall == 0.25  # tied best: 0.15, 0.2, 0.25, 0.3
    assert chosen.own == {}  # 8 positives: fewer than MIN_POSITIVES


def test_a_label_with_enough_positives_gets_its_own_threshold_where_it_does_better():
    """joy's positives score 0.8 (its negatives 0.6), love's 0.3 (negatives 0.1): the global threshold suits joy,
    and love gets its own; rare has too few positives for one of its own and takes the global one."""
    joy = rows_scored([0.8] * MIN_POSITIVES, [0.6] * 30)
    love = rows_scored([0.3] * MIN_POSITIVES, [0.1] * 30)
    rare = rows_scored([0.9] * 3 + [0.1] * (MIN_POSITIVES - 3), [0.1] * 30)
    logits = np.stack([joy[0], love[0], rare[0]], axis=1)
    labels = np.stack([joy[1], love[1], rare[1]], axis=1)
    chosen = choose(logits, labels, ["joy", "love", "rare"])
    assert 0.6 < chosen.overall <= 0.8 and set(chosen.own) == {"love"} and 0.1 < chosen.own["love"] <= 0.3
    predicted = logits >= chosen.cuts(["joy", "love", "rare"])
    assert (predicted[:, :2] == (labels[:, :2] == 1)).all()  # joy and love exactly right


def test_a_label_whose_own_threshold_does_no_better_takes_the_global_one():
    same = rows_scored([0.3] * 20, [0.1] * 20)
    logits, labels = np.stack([same[0], same[0]], axis=1), np.stack([same[1], same[1]], axis=1)
    assert choose(logits, labels, ["a", "b"]).own == {}


def test_a_weak_label_keeps_the_global_threshold_where_its_own_best_f1_would_flood_micro_f1():
    """weak's positives score 0.2 like 100 of its negatives: its own F1 is best at 0.2 (0.29 against 0),
    but predicting its 120 rows there takes micro F1 from 0.8 to 0.55 (semeval2018-ec's case: every
    weakly learned label's own threshold fell to 0.05-0.2 and held-out micro F1 from 0.61 to 0.50)."""
    strong = rows_scored([0.9] * 40, [0.1] * 160)
    weak = rows_scored([0.2] * 20, [0.2] * 100 + [0.05] * 80)
    logits, labels = np.stack([strong[0], weak[0]], axis=1), np.stack([strong[1], weak[1]], axis=1)
    chosen = choose(logits, labels, ["strong", "weak"])
    assert chosen.own == {}
    metrics = thresholds_metrics(logits, labels, chosen)
    assert metrics["f1_micro"] == 0.8


def thresholds_metrics(logits: np.ndarray, labels: np.ndarray, chosen: Thresholds) -> dict:
    from byoc.tasks.multi_label import multilabel_metrics

    names = [f"l{j}" for j in range(labels.shape[1])]
    return multilabel_metrics(logits, labels, chosen.cuts(names), names)[0]


def test_saved_in_the_config_and_read_back_as_serving_reads_them():
    config = PretrainedConfig(id2label={0: "anger", 1: "joy", 2: "love"})
    config.byoc_thresholds = {"gone": 0.1}
    Thresholds(0.35, {"love": 0.2, "anger": 0.6}).save(config)
    saved = config.to_dict()
    assert saved[model_folder.THRESHOLD_KEY] == 0.35 and saved[model_folder.THRESHOLDS_KEY] == {
        "love": 0.2,
        "anger": 0.6,
    }
    as_json = {**saved, "id2label": {str(k): v for k, v in saved["id2label"].items()}}  # config.json's keys
    for config_dict in (saved, as_json):  # NaN: joy has none of its own (it takes byoc_threshold)
        np.testing.assert_array_equal(model_folder.thresholds_of(config_dict), [0.6, np.nan, 0.2])
    assert model_folder.thresholds_of({**saved, model_folder.THRESHOLDS_KEY: {}}) is None


def test_task_metrics_choose_on_the_eval_data_and_score_later_evaluations_at_the_choice():
    class Prediction:
        def __init__(self, logits, labels):
            self.predictions, self.label_ids = logits, labels

    logits, labels = rows_scored([0.3] * 12, [0.1] * 28)
    scoring = TaskMetrics(tasks.MULTI_LABEL, ["joy"], None, choosing=True)
    first = scoring(Prediction(logits[:, None], labels[:, None]))
    assert first["f1_micro"] == 0.0 and first["f1_micro_tuned"] == 1.0  # nothing reaches 0.5
    assert scoring.tuned is not None and scoring.details["tuned"]["exact_match"] == 1.0
    scoring.choosing = False
    kept = scoring.tuned
    assert scoring(Prediction(logits[:6, None], labels[:6, None]))["f1_micro_tuned"] == 1.0
    assert scoring.tuned is kept  # a later evaluation (test) chooses nothing
    fixed = TaskMetrics(tasks.MULTI_LABEL, ["joy"], 0.5, choosing=True)  # a threshold given: no choice
    assert "f1_micro_tuned" not in fixed(Prediction(logits[:, None], labels[:, None])) and fixed.tuned is None
    assert thresholds.GRID[0] == 0.05 and thresholds.GRID[-1] == 0.95
