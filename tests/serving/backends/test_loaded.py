"""The loaded model is one typed value that both backends build (`LoadedModel.of`), and still the mapping
users' code reads and changes (`model["encode"]`, `model["threshold"] = 0.6` in a model_fn of their own)."""

from __future__ import annotations

import pytest

from byoc import tasks
from byoc.serving.backends.loaded import LoadedModel


def loaded(**facts) -> LoadedModel:
    return LoadedModel.of(
        tasks.get(tasks.MULTI_LABEL),
        facts,
        backend="onnxruntime",
        model=None,
        tokenizer=None,
        encode=lambda inputs: [],
        logits=lambda feeds: feeds,
        windows=None,
        id2label={0: "a", 1: "b"},
        activation=None,
        max_length=128,
        pad_id=0,
        passes=None,
        device="cpu",
        precision="fp32",
    )


def test_fields_and_the_tasks_facts_read_as_one_mapping():
    model = loaded(threshold=0.4, thresholds=None)
    assert model.task == model["task"] == "multi_label_classification" and model["max_length"] == 128
    assert model["threshold"] == 0.4 and model.get("prompts") is None and "facts" not in model
    assert set(model) == {*(k for k in vars(model) if k != "facts"), "threshold", "thresholds"}
    assert {**model}["id2label"] == {0: "a", 1: "b"} and len(model) == len(dict(model))


def test_a_users_model_fn_may_change_a_fact_or_a_field_but_not_remove_a_field():
    model = loaded(threshold=0.4)
    model["threshold"] = 0.6  # as tests/serving/test_handlers.py's model_fn does
    model["pad_id"] = 3
    model["extra"] = "mine"
    assert (model.facts["threshold"], model.pad_id, model["extra"]) == (0.6, 3, "mine")
    del model["extra"]
    with pytest.raises(KeyError, match="is a field"):
        del model["encode"]
    with pytest.raises(KeyError):
        model["missing"]


def test_each_task_keeps_its_own_facts():
    """What a folder's config.json says reaches only the task it concerns (Task.serving_facts)."""
    config = {"byoc_threshold": 0.3, "byoc_word_tags": "all", "byoc_pairs": True, "problem_type": "regression"}
    assert tasks.get(tasks.MULTI_LABEL).serving_facts(None, config) == {"threshold": 0.3, "thresholds": None}
    assert tasks.get(tasks.TOKEN_CLASSIFICATION).serving_facts(None, config) == {
        "aggregation": "whitespace-words:average"
    }
    assert tasks.get(tasks.SINGLE_LABEL).serving_facts(None, config) == {"pairs": True}
    assert tasks.get(tasks.REGRESSION).serving_facts(None, config) == {"stated_regression": True, "pairs": True}
    assert tasks.get(tasks.SINGLE_LABEL).serving_facts(None, {"byoc_pairs": "yes"}) == {"pairs": None}
