"""byoc.tasks.token_classification: entities by conlleval's rules, and their metrics."""

import pytest


def test_entities_follow_conlleval_rules():
    from byoc.tasks.token_classification import entities

    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER", "O", "B-X"]
    # An I- after O starts an entity; a B- ends one; a change of type ends one and starts another.
    assert entities(tags) == {("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("PER", 6, 6), ("X", 8, 8)}


def test_token_metrics_by_hand():
    from byoc.tasks.token_classification import token_metrics

    true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-LOC"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-PER", "B-LOC"]]
    metrics, per_type = token_metrics(true, predicted)
    # Gold: PER(0-1), LOC(3), LOC(1:1); predicted: PER(0-1), PER(1:0), LOC(1:1): 2 right of 3 each way.
    assert metrics["precision"] == pytest.approx(2 / 3) and metrics["recall"] == pytest.approx(2 / 3)
    assert metrics["f1"] == pytest.approx(2 / 3) and metrics["accuracy"] == pytest.approx(4 / 6)
    assert per_type == {"LOC": pytest.approx(2 / 3, abs=1e-6), "PER": pytest.approx(2 / 3, abs=1e-6)}
