"""The loaded model is one typed value that both backends build (`LoadedModel.of`), and still the mapping
users' code reads and changes (`model["encode"]`, `model["threshold"] = 0.6` in a model_fn of their own)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

import pytest

from byoc import tasks
from byoc.serving.backends.loaded import RUNTIME_FIELDS, LoadedModel, in_background


def loaded(backend: str = "onnxruntime", **facts) -> LoadedModel:
    return LoadedModel.of(
        tasks.get(tasks.MULTI_LABEL),
        facts,
        backend=backend,
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
    assert set(model) == {*(k for k in vars(model) if k not in ("facts", "upgrade")), "threshold", "thresholds"}
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
    """What a folder's config.json says reaches only the task it concerns (Head.serving_facts)."""
    config = {"byoc_threshold": 0.3, "byoc_word_tags": "all", "byoc_pairs": True, "problem_type": "regression"}
    assert tasks.get(tasks.MULTI_LABEL).head.serving_facts(None, config) == {"threshold": 0.3, "thresholds": None}
    assert tasks.get(tasks.TOKEN_CLASSIFICATION).head.serving_facts(None, config) == {
        "aggregation": "whitespace-words:average"
    }
    assert tasks.get(tasks.SINGLE_LABEL).head.serving_facts(None, config) == {"pairs": True}
    assert tasks.get(tasks.REGRESSION).head.serving_facts(None, config) == {"stated_regression": True, "pairs": True}
    assert tasks.get(tasks.SINGLE_LABEL).head.serving_facts(None, {"byoc_pairs": "yes"}) == {"pairs": None}


def test_the_model_loaded_in_the_background_takes_over_its_runtime_once_loaded_and_keeps_the_facts():
    bridge, gate = loaded(threshold=0.4), threading.Event()
    torch_model = loaded("torch", threshold=0.9)
    torch_model.device, torch_model.passes, torch_model.max_length = "cuda", "buckets", 512

    def load() -> LoadedModel:
        gate.wait()
        return torch_model

    bridge.upgrade = in_background(load, "test-load")
    assert not bridge.settle() and bridge.backend == "onnxruntime"  # still loading: the bridge answers
    assert "upgrade" not in bridge and "upgrade" not in dict(bridge)  # (not part of the mapping users read)
    gate.set()
    bridge.upgrade.result(timeout=60)  # (waits on the load itself, not on a guessed time)
    assert bridge.settle() and bridge.upgrade is None
    assert all(getattr(bridge, name) is getattr(torch_model, name) for name in RUNTIME_FIELDS)
    assert (bridge.backend, bridge.device, bridge.max_length) == ("torch", "cuda", 512)
    assert bridge["threshold"] == 0.4  # the folder's facts, as the bridge read them
    assert not bridge.settle()  # once only


def test_a_background_load_that_fails_leaves_the_bridge_serving_and_says_why(caplog):
    bridge = loaded()
    failed: Future = Future()
    failed.set_exception(RuntimeError("CUDA out of memory"))
    bridge.upgrade = failed
    with caplog.at_level(logging.ERROR):
        assert not bridge.settle()
    assert bridge.backend == "onnxruntime" and bridge.upgrade is None
    assert "onnxruntime on the cpu keeps serving: RuntimeError: CUDA out of memory" in caplog.text
