"""byoc.serving.execution.long_texts: a token classifier's long texts in steps, answered as one call answers."""

from __future__ import annotations

import random

import pytest
import serve_helpers

from byoc.serving import default_pipeline
from byoc.serving.execution import long_texts
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings
from byoc.tasks.token_classification import head as entities

WORDS = [
    "John",
    "Smith",
    "lives",
    "in",
    "Paris",
    "and",
    "U.S.",
    "at",
    "Lloyd-Webber",
    "today.",
    "a,b",
    "Müller",
    "東京",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir) -> dict:
    """On the CPU, in fp32, also on a GPU machine: the steps put other windows side by side in a pass than
    one call does, and only the CPU's exact padding makes that change no bit of a score."""
    folder = serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, "token_classification")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(default_pipeline, "nvidia_gpu", lambda: False)
        with default_pipeline.serving_with(InferenceSettings(backend="onnxruntime", precision="fp32")):
            return default_pipeline.model_fn(str(folder))


def run(work: long_texts.Stepwise) -> int:
    steps = 0
    for step in work.steps():
        step()
        steps += 1
    return steps


@pytest.mark.parametrize("strategy", [*entities.STRATEGIES, "trained first", "trained all"])
def test_steps_answer_what_one_call_answers(model, strategy):
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(2000)), "John Smith lives in Paris", "Müller " * 300]
    parameters = {"aggregation_strategy": strategy}
    if strategy.startswith("trained"):  # no strategy asked: the default of a model byoc trained (its words)
        parameters, model = {}, {**model, "aggregation": entities.default_strategy(strategy.split()[1])}
    work = long_texts.Stepwise(texts, parameters, model)
    steps = run(work)
    assert steps > 3  # the tokenizer, then the windows (128 tokens in the tiny model) STEP_TOKENS at a time
    answers = work.answers()
    assert answers == default_pipeline.predict_fn({"inputs": texts, "parameters": parameters}, model)
    assert answers[0], "the tiny model's random head tags some tokens"


def test_only_a_token_classifiers_long_requests_run_in_steps(model):
    long_text = "word " * (long_texts.STEPWISE_CHARS // 5 + 1)
    assert long_texts.stepwise(model, {"inputs": long_text}) is not None
    assert long_texts.stepwise(model, {"inputs": [long_text[:1000], long_text[:1000], "x" * 49]}) is not None
    assert long_texts.stepwise(model, {"inputs": [long_text[: long_texts.STEPWISE_CHARS]]}) is None
    assert long_texts.stepwise({**model, "task": "single_label_classification"}, {"inputs": long_text}) is None


@pytest.mark.parametrize(
    "inputs,parameters,words",
    [
        (["x " * 2000, "  "], {}, "input 1 is empty"),
        (["x " * 2000, {"text": "a", "text_pair": "b"}], {}, "not a pair"),
        (["x " * 2000], {"aggregation_strategy": "all"}, "aggregation_strategy"),
    ],
)
def test_a_bad_long_request_is_refused_before_any_step(model, inputs, parameters, words):
    with pytest.raises(InputError, match=words):
        long_texts.Stepwise(inputs, parameters, model)
