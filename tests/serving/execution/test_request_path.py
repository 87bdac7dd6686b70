"""One request's path through `ModelServer.invoke` and the default handlers, without a process or a model:
the answer's shape comes from the body's form (never from the client's parameters), is built around any
predict_fn, is written off the event loop when it is large, and carries nothing a client cannot parse
(issue 55's findings 3, 4, 6, 8, 9 and its low ones on bodies)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from byoc.serving import default_pipeline
from byoc.serving.execution import model_server
from byoc.serving.execution.model_server import ModelServer
from byoc.serving.protocol import bodies, outputs
from byoc.serving.protocol.request_errors import InputError, InvalidAnswer, PayloadTooLarge
from byoc.serving.settings import ServeSettings
from byoc.serving.user_code.handler_loader import Handlers

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def parse(body: Any, content_type: str = "application/json") -> dict[str, Any]:
    return default_pipeline.input_fn(json.dumps(body) if not isinstance(body, str) else body, content_type)


# -- the shape is the body's form ----------------------------------------------------------------------


def test_a_clients_parameters_cannot_set_the_answers_shape():
    """{"parameters": {"shape": "rerank"}} to a classifier was answered as a sorted rerank list whose texts
    were single letters: the shape is now the body's form alone."""
    data = parse({"inputs": ["hello world", "bye now"], "parameters": {"shape": "rerank"}})
    assert "shape" not in data and data["inputs"] == ["hello world", "bye now"]
    answers = [{"label": "a", "score": 0.1}, {"label": "b", "score": 0.9}]
    assert outputs.shaped(data, answers) == answers  # one answer per input, as the client's body asked
    data = parse({"inputs": ["a"], "parameters": {"shape": "rerank", "return_text": True}})
    with pytest.raises(InputError, match='"return_text" applies to rerank requests'):
        default_pipeline.predict_fn(data, {"task": "single_label_classification"})


def test_the_body_forms_set_their_shapes():
    assert parse({"query": "q", "texts": ["a", "b"]})["shape"] == "rerank"
    assert parse({"query": "q", "texts": ["a", "b"]})["inputs"] == [("q", "a"), ("q", "b")]
    assert parse({"input": ["a"], "model": "m"})["shape"] == "openai"
    assert "shape" not in parse({"inputs": ["a"]})


@pytest.mark.parametrize("text, kind", [(None, "null"), (3, "int"), ({"text": "x"}, "dict"), (["x"], "list")])
def test_a_rerank_text_that_is_not_a_string_is_a_400_naming_its_position(text, kind):
    with pytest.raises(InputError, match=rf'"texts"\[1\] is {kind}: each text to rank must be a string'):
        parse({"query": "q", "texts": ["fine", text]})


def test_a_rerank_query_is_checked_once_and_a_bad_one_named():
    with pytest.raises(InputError, match='"query" is not valid Unicode'):
        default_pipeline.input_fn('{"query": "\\ud800", "texts": ["a", "b"]}')
    with pytest.raises(InputError, match=r'"texts"\[1\] is not valid Unicode'):
        default_pipeline.input_fn('{"query": "q", "texts": ["a", "\\ud800"]}')
    calls = []
    real = bodies.valid_unicode
    try:
        bodies.valid_unicode = lambda text: calls.append(len(text)) or real(text)  # type: ignore[assignment]
        parse({"query": "é" * 1000, "texts": ["a"] * 50})
    finally:
        bodies.valid_unicode = real  # type: ignore[assignment]
    assert calls.count(1000) == 1 and len(calls) == 51  # the query once, each text once


def test_an_openai_body_with_no_input_names_input():
    with pytest.raises(InputError, match='^"input" is empty'):
        parse({"input": [], "model": "m"})


def test_rerank_keys_beside_inputs_and_truncation_direction_are_never_ignored():
    data = parse({"inputs": ["a"], "top_n": 2})
    with pytest.raises(InputError, match='"top_n" applies to rerank requests'):
        default_pipeline.predict_fn(data, {"task": "single_label_classification"})
    for direction in ("Right", "left"):  # (TEI's capitalised, huggingface_hub's lower case)
        assert (
            parse({"inputs": ["a"], "truncation_direction": direction})["parameters"]["truncation_direction"]
            == direction
        )
    with pytest.raises(InputError, match='"truncation_direction" is "right" .* or "left" .*; got .middle.'):
        parse({"inputs": ["a"], "truncation_direction": "middle"})
    with pytest.raises(InputError, match='"truncation_direction" is "right"'):
        parse({"query": "q", "texts": ["a"], "truncation_direction": "start"})


@pytest.mark.parametrize("task", ["token_classification", "embedding"])
def test_a_rerank_body_to_a_model_that_does_not_rerank_says_so(task):
    with pytest.raises(InputError, match="does not rerank: a rerank request"):
        default_pipeline.predict_fn(parse({"query": "q", "texts": ["a, b", "c"]}), {"task": task})


def test_the_early_count_reads_the_key_the_parser_reads():
    """A decoy "texts": ["a"] before "inputs" made the count read the decoy: the big list was parsed whole."""
    many = json.dumps({"texts": ["a"], "inputs": ["x"] * 50})
    assert bodies.too_many_inputs(many, "application/json", 10)
    assert not bodies.too_many_inputs(json.dumps({"texts": ["a"] * 50, "inputs": ["x"]}), "application/json", 10)
    assert bodies.too_many_inputs(json.dumps({"query": "q", "texts": ["a"] * 50}), "application/json", 10)
    assert bodies.too_many_inputs(json.dumps({"model": "m", "input": ["a"] * 50}), "application/json", 10)
    assert not bodies.too_many_inputs(
        json.dumps({"inputs": "a, b, c, d, e, f, g, h, i, j, k, l"}), "application/json", 3
    )


# -- the answer ----------------------------------------------------------------------------------------


def test_base64_refuses_nan_as_the_float_answer_does():
    data = {"inputs": ["a"], "parameters": {"encoding_format": "base64"}, "shape": "openai"}
    with pytest.raises(InvalidAnswer, match="NaN or infinity"):
        outputs.shaped(data, [outputs.Embedded([0.5, math.nan], 3)])
    answer = outputs.shaped(data, [outputs.Embedded([0.5, 0.25], 3)])
    assert np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), "<f4").tolist() == [0.5, 0.25]
    assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_a_rerank_answer_that_is_not_a_number_is_a_500_saying_what_predict_fn_must_return():
    data = parse({"query": "q", "texts": ["a", "b"]})
    with pytest.raises(InvalidAnswer, match="pair 0 with dict"):
        outputs.shaped(data, [{"label": "x", "score": 0.3}, {"label": "y", "score": 0.2}])
    assert outputs.shaped({**data, "parameters": {"top_n": 1}}, [0.1, 0.7]) == [{"index": 1, "score": 0.7}]


def test_json_text_refuses_non_finite_numbers_and_writes_null_words_without_json():
    assert default_pipeline.json_text({"model": "null", "v": [0.5, None]}) == '{"model":"null","v":[0.5,null]}'
    for bad in ([[0.1, math.nan]], {"a": [math.inf]}, [1e308, 1e308, math.nan], -math.inf):
        with pytest.raises(ValueError):
            default_pipeline.json_text(bad)
    assert default_pipeline.json_text([1e308, 1e308, None]) == "[1e+308,1e+308,null]"  # an overflowing sum: no NaN


# -- through ModelServer.invoke --------------------------------------------------------------------------


class Vectors:
    """A model's own batchable predict_fn answering each text with a vector of `width`, noting its thread."""

    batchable = True

    def __init__(self, width: int) -> None:
        self.width = width
        self.data: list[dict] = []

    def __call__(self, data: dict, model: Any) -> list[Any]:
        self.data.append(data)
        return [[0.25] * self.width for _ in data["inputs"]]


def invoke(
    handlers: Handlers, body: Any, accept: str = "application/json", model: Any = None, **settings: Any
) -> tuple[Any, list]:
    """The answer to one request through a ModelServer on `handlers` (and `model`: an embedding model's dict
    by default), and the threads its answer was written on (True: the event loop's)."""
    server = ModelServer(replace(ServeSettings.from_env({}), model_dir=Path("."), **settings))
    server.handlers, server.model = handlers, model or {"task": "embedding"}
    written_on: list[bool] = []
    write = server._write

    def noting(*args: Any) -> Any:
        written_on.append(threading.current_thread() is threading.main_thread())
        return write(*args)

    server._write = noting  # type: ignore[method-assign]

    async def run() -> Any:
        server.start(lambda reason: None)
        try:
            return await server.invoke(json.dumps(body).encode(), "application/json", accept)
        finally:
            await server.stop()

    server.load = lambda: None  # type: ignore[method-assign]
    return asyncio.run(run()), written_on


def user_handlers(predict_fn: Any) -> Handlers:
    d = default_pipeline
    return Handlers(d.model_fn, d.input_fn, predict_fn, d.output_fn, None, "test", d.ACCEPT_TYPES)


def test_a_large_answer_to_a_small_request_is_written_off_the_event_loop():
    """4,096 one-letter texts to a 1,024-wide model: a 16 KB request, a 4 M-value answer. It was written as CSV
    on the event loop (every float formatted in Python: /ping waited seconds)."""
    answer, written_on = invoke(user_handlers(Vectors(1024)), {"inputs": ["a"] * 512}, accept="text/csv")
    assert written_on == [False] and len(answer.body.splitlines()) == 512
    answer, written_on = invoke(user_handlers(Vectors(4)), {"inputs": ["a"] * 4}, accept="text/csv")
    assert written_on == [True]  # a small answer still costs no thread hop
    assert outputs.cells([[0.0] * 1024] * 512) == 512 * 1024 > model_server.INLINE_CELLS


def test_the_shapes_are_built_around_a_models_own_predict_fn():
    """A model's own predict_fn (the edited template) still gets OpenAI's object and its base64, and the
    request's shape reaches it apart from the client's parameters."""
    predict = Vectors(2)
    answer, _ = invoke(user_handlers(predict), {"input": ["a", "b"], "model": "null", "encoding_format": "base64"})
    body = json.loads(answer.body)
    assert body["object"] == "list" and body["model"] == "null" and len(body["data"]) == 2
    assert np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), "<f4").tolist() == [0.25, 0.25]
    assert predict.data[0]["shape"] == "openai" and "shape" not in predict.data[0]["parameters"]


def test_a_token_classifiers_text_limit_holds_whatever_predict_fn_serves():
    server = ModelServer(replace(ServeSettings.from_env({}), model_dir=Path("."), max_text_chars=100))
    server.model = {"task": "token_classification"}
    with pytest.raises(PayloadTooLarge, match="101 characters"):
        server._check_text(model_server.long_texts.whole_text_chars(server.model, {"inputs": ["x" * 101]}))
    predict = Vectors(1)
    with pytest.raises(PayloadTooLarge, match="over the limit of 100"):
        handlers = user_handlers(predict)
        invoke(handlers, {"inputs": ["x" * 101]}, model={"task": "token_classification"}, max_text_chars=100)
    assert predict.data == []  # refused before the model's own code ran


def test_a_two_label_classifier_trained_on_single_texts_refuses_rerank_before_it_runs():
    """It answered rerank requests without a word; config.json now says whether training read pairs."""
    model = {"task": "single_label_classification", "id2label": {0: "neg", 1: "pos"}, "pairs": False}
    with pytest.raises(InputError, match="trained on single texts, not on \\(query, text\\) pairs"):
        default_pipeline.predict_fn(parse({"query": "q", "texts": ["a"]}), model)  # no "encode": it never ran
    three = {"task": "single_label_classification", "id2label": {0: "a", 1: "b", 2: "c"}}
    with pytest.raises(InputError, match="a single-label classifier does not rerank"):
        default_pipeline.predict_fn(parse({"query": "q", "texts": ["a"]}), three)


def test_openai_usage_counts_what_ran_prompt_included_where_it_was_tokenized():
    """usage tokenized every input again on the event loop and left the prompt out; now each text's tokens
    are counted by the default predict_fn (the inference thread), its prompt included."""
    encoded: list[list[str]] = []

    def encode(inputs):
        encoded.append(list(inputs))
        return [{"input_ids": [1] * len(t.split()), "attention_mask": [1] * len(t.split())} for t in inputs]

    model = {
        "task": "embedding",
        "encode": encode,
        "logits": lambda batch: np.ones((len(batch["input_ids"]), 4), dtype=np.float32),
        "pad_id": 0,
        "id2label": {0: "LABEL_0"},
        "prompts": {"query": "query of mine: "},
        "default_prompt_name": "query",
    }
    data = parse({"input": ["a b", "c"], "model": "m"})
    answers = default_pipeline.predict_fn(data, model)
    assert [a.tokens for a in answers] == [3 + 2, 3 + 1] and encoded == [["query of mine: a b", "query of mine: c"]]
    assert outputs.shaped(data, answers)["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert len(encoded) == 1  # the answer's envelope tokenized nothing again
