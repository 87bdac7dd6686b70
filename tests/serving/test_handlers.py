"""The handlers in process: the default input_fn refuses, with a 4xx naming the input, whatever a
model could choke on; output_fn negotiates as the server does; and a model's own code is loaded as
the AWS toolkits load it."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest
import serve_helpers
from accept_cases import ACCEPT_CASES

from byoc.serving import default_pipeline
from byoc.serving.backends import runtimes
from byoc.serving.execution import long_texts
from byoc.serving.protocol import bodies
from byoc.serving.protocol.request_errors import InputError, InvalidAnswer, NotAcceptable
from byoc.serving.user_code.handler_loader import HandlerError, call, load_handlers


@pytest.fixture(scope="module")
def tiny_classifier_model(tmp_path_factory, tiny_model_dir):
    """What the default model_fn returns for a tiny classifier (ONNX Runtime)."""
    return default_pipeline.model_fn(str(serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)))


def test_handlers_get_context_only_when_they_take_it():
    class Unhashable:
        __hash__ = None

        def __call__(self, data, model, context):
            return context

    assert call(lambda data, model: "plain", "predict_fn", 1, 2, context="ctx") == "plain"
    assert call(lambda data, model, context=None: context, "predict_fn", 1, 2, context="ctx") == "ctx"
    assert call(lambda *args: args[-1], "predict_fn", 1, 2, context="ctx") == "ctx"
    assert call(Unhashable(), "predict_fn", 1, 2, context="ctx") == "ctx"


# --- input_fn: every input checked before it can join a batch ---------------------------------


@pytest.mark.parametrize(
    "body,content_type,words",
    [
        # Valid JSON, but strings the tokenizer cannot encode (lone surrogates): the batch's poison.
        (b'{"inputs": ["fine", "\\ud800 broken"]}', "application/json", "input 1 is not valid Unicode"),
        (b'{"inputs": [{"text": "ok", "text_pair": "\\udfff"}]}', "application/json", "input 0 is not valid Unicode"),
        (b'["a", "b", ["c", "\\ud83d"]]', "application/json", "input 2 is not valid Unicode"),
        (b'{"inputs": "x"}\n"\\ud800"\n', "application/jsonlines", "input 1 is not valid Unicode"),
        (b'{"inputs": ["a", 7]}', "application/json", "input 1: each input must be"),
        # An object with none of the keys read: which keys it has (a misspelt "inputs"), not "input 0".
        (b'{"inputz": "hello"}', "application/json", 'the JSON object has no "inputs"'),
        (b'{"sentences": ["a"], "query": "q"}', "application/json", 'its keys: "sentences", "query"'),
        (b"{}", "application/json", "its keys: none (an empty object)"),
        # "parameters" that is not an object, even an empty list or string: refused, not read as none.
        (b'{"inputs": "x", "parameters": []}', "application/json", '"parameters" must be a JSON object'),
        (b'{"inputs": "x", "parameters": ""}', "application/json", '"parameters" must be a JSON object'),
        # Deeply nested JSON: a RecursionError in the parser.
        (b"[" * 100_000 + b"]" * 100_000, "application/json", "nested too deeply"),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json", "nested too deeply"),
        (b"[" * 100_000 + b"\n", "application/jsonlines", "nested too deeply"),
        # What json and csv raise that is not their usual error class.
        # A number past Python's 4300 digits: said in the client's terms, never as Python's advice.
        (b"1" * 5000, "application/json", "a number in the body has more than 4300 digits"),
        (b'{"inputs": "x", "parameters": {"top_k": ' + b"9" * 5000 + b"}}", "application/json", "4300 digits"),
        (b'"fine"\n' + b"1" * 5000 + b"\n", "application/jsonlines", "a number in a JSON Lines record has more"),
        (b'"' + b"x" * 200_000 + b'"\n', "text/csv", "not valid CSV"),
        (b"fine\n\xff\xfe\n", "text/csv", "not UTF-8 text (byte 5, line 2)"),
        # top_k is checked before the request joins a batch, not in the batch.
        (b'{"inputs": "x", "parameters": {"top_k": 0}}', "application/json", "top_k"),
        (b'{"inputs": "x", "parameters": {"top_k": true}}', "application/json", "top_k"),
    ],
)
def test_input_fn_refuses_what_the_model_cannot_take(body, content_type, words):
    with pytest.raises(InputError) as caught:
        default_pipeline.input_fn(body, content_type)
    assert caught.value.status == 400 and words in str(caught.value)
    assert "sys." not in str(caught.value)  # Python's internals mean nothing to an HTTP client


# A token classifier's CSV: unquoted commas are the text's; quoted fields still read as CSV.
NER_CSV = b'John Smith, of Paris\n"Smith, John"\r\na,"b,c"\n"two\nlines, one text",x\n\nplain\n'


def test_a_csv_row_is_one_text_where_each_input_is_one_text():
    """A token classifier's text with a comma was a 400 "not a pair": CSV split it into two fields."""
    texts = ["John Smith, of Paris", "Smith, John", 'a,"b,c"', '"two\nlines, one text",x', "plain"]
    assert default_pipeline.input_fn(NER_CSV, "text/csv", one_text=True)["inputs"] == texts
    pairs = [("John Smith", " of Paris"), "Smith, John", ("a", "b,c"), ("two\nlines, one text", "x"), "plain"]
    assert default_pipeline.input_fn(NER_CSV, "text/csv")["inputs"] == pairs  # a classifier's: pairs, as before


def test_an_object_without_inputs_names_a_bounded_few_of_its_keys():
    body = json.dumps({f"{i:03d}" + "k" * 1000: i for i in range(10_000)}).encode()
    with pytest.raises(InputError) as caught:
        default_pipeline.input_fn(body, "application/json")
    said = str(caught.value)
    assert said.count('"000kkk') == 1 and '"007' in said and '"008' not in said and said.endswith(", ...")
    assert len(said) < 1000
    # the shapes that are read stay read: a pair as the whole body, and null parameters
    assert default_pipeline.input_fn(b'{"text": "a", "text_pair": "b"}', "application/json")["inputs"] == [("a", "b")]
    assert default_pipeline.input_fn(b'{"text": "a"}', "application/json")["inputs"] == ["a"]
    assert default_pipeline.input_fn(b'{"inputs": "a", "parameters": null}', "application/json")["parameters"] == {}


def test_input_fn_keeps_every_valid_text():
    texts = ["plain", "émotions 😀", "\x00nul", "", "\uffff", '"quoted, with comma"']
    parsed = default_pipeline.input_fn(json.dumps({"inputs": texts}).encode(), "application/json")
    assert parsed["inputs"] == texts


def test_predict_fn_names_the_input_a_custom_input_fn_let_through(tiny_classifier_model):
    """A user's input_fn may skip the checks: the default predict_fn still blames the input (4xx)."""
    with pytest.raises(InputError, match="input 1 is not valid Unicode"):
        default_pipeline.predict_fn({"inputs": ["fine", "\ud800"], "parameters": {}}, tiny_classifier_model)


@pytest.mark.parametrize("accept,kind", ACCEPT_CASES)
def test_output_fn_reads_a_whole_accept_header(accept, kind):
    prediction = [{"label": "positive", "score": 0.75}]
    _, content_type = default_pipeline.output_fn(prediction, accept)
    assert content_type == kind


def test_output_fn_refuses_what_nobody_accepts():
    with pytest.raises(NotAcceptable):
        default_pipeline.output_fn([{"label": "a", "score": 1.0}], "image/png, */*;q=0")


# --- a model's own code, loaded like the AWS toolkits load it ---------------------------------


def code_dir(tmp_path, files: dict[str, str]):
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    for name, source in files.items():
        (model / "code" / name).write_text(source)
    return model


USER_CODE = """
from __future__ import annotations

import pickle
from dataclasses import dataclass


@dataclass
class Answer:
    label: str
    score: float


def output_fn(prediction, accept):
    import helper  # a sibling, imported when first called, long after the module loaded

    answers = [Answer(p["label"], p["score"]) for p in prediction]
    again = pickle.loads(pickle.dumps(answers))  # a class of this module pickles and unpickles
    return helper.render(again), "application/json"
"""
HELPER = """
import json

import inference  # the module that imported this one: the same module object, not a second copy


def render(answers):
    assert all(isinstance(a, inference.Answer) for a in answers)
    return json.dumps([a.label for a in answers])
"""


def test_user_code_loads_like_the_toolkits(tmp_path, monkeypatch):
    """Registered in sys.modules under its own name, its folder kept on sys.path: a dataclass with
    postponed annotations, pickling its classes and `import helper` inside a function all work."""
    # What the loader leaves, as the toolkits do (the folder on sys.path, `helper` imported), is undone
    # after the test: other tests' models have a `helper` of their own.
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        _loads_like_the_toolkits(tmp_path)
    finally:
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
                del sys.modules[name]


def _loads_like_the_toolkits(tmp_path) -> None:
    model = code_dir(tmp_path, {"inference.py": USER_CODE, "helper.py": HELPER})
    handlers = load_handlers(model)
    assert handlers.output_fn(([{"label": "joy", "score": 0.5}]), "application/json") == (
        '["joy"]',
        "application/json",
    )
    answer = sys.modules["inference"].Answer("joy", 0.5)  # pickle finds its class by the module's name
    assert pickle.loads(pickle.dumps(answer)) == answer
    again = load_handlers(code_dir(tmp_path / "again", {"inference.py": USER_CODE, "helper.py": HELPER}))
    assert again.output_fn is not handlers.output_fn  # a model loaded again replaces the module


def test_code_that_exits_while_loading_is_a_failed_start(tmp_path):
    """argparse at import calls sys.exit: a SystemExit, not an Exception. It used to escape the
    loader and leave the server answering 503 until SageMaker's start-up timeout."""
    source = "import argparse\nargparse.ArgumentParser().parse_args(['--no-such-flag'])\n"
    with pytest.raises(HandlerError, match=r"SystemExit: 2.*__main__"):
        load_handlers(code_dir(tmp_path, {"inference.py": source}))
    assert "inference" not in sys.modules or sys.modules["inference"].__file__ != str(
        tmp_path / "model" / "code" / "inference.py"
    )


def test_a_program_named_like_a_module_in_use_is_refused(tmp_path):
    with pytest.raises(HandlerError, match="rename it"):  # SAGEMAKER_PROGRAM=json.py (ServeSettings.program)
        load_handlers(code_dir(tmp_path, {"json.py": "def output_fn(p, a):\n    return '', 'text/plain'\n"}), "json.py")
    assert sys.modules["json"] is json


@pytest.mark.parametrize(
    "body,content_type,count",
    [
        (b'{"inputs": ["a", "b", "c"]}', "application/json", 3),
        (b'["a", "b", "c"]', "application/json", 3),
        (b'"one text, with commas, in it"', "application/json", 1),
        (b'{"parameters": {"top_k": 1, "x": [1, 2, 3]}, "inputs": ["a", "b"]}', "application/json", 2),
        (b'{"inputs": [1, 2, 3, 4, 5]}', "application/json", 5),  # counted whatever they are
        (b'{"inputs": [["a", "b"], ["c", "d"]]}', "application/json", 2),
        (b"a\nb\n\n  \nc\n", "text/plain", 3),
        (b'{"inputs": "a"}\n{"inputs": "b"}\n\n', "application/jsonlines", 2),
        (b'a,b\n"c\nstill c"\n\nd\n', "text/csv", 3),
        (b'{"query": "q", "top_n": 2, "texts": ["a", "b", "c", "d"]}', "application/json", 4),  # TEI's rerank
        (b'{"model": "m", "input": ["a", "b"]}', "application/json", 2),  # OpenAI's embeddings
    ],
)
def test_inputs_are_counted_without_building_them(body, content_type, count):
    """Counted up to the limit + 1: the server refuses a body of a million tiny inputs after reading
    a few thousand, not after building them all."""
    assert bodies.too_many_inputs(body, content_type, count - 1)
    assert not bodies.too_many_inputs(body, content_type, count)
    if count < 5:  # the count is input_fn's own
        assert len(default_pipeline.input_fn(body, content_type)["inputs"]) == count


def test_counting_a_huge_body_stops_at_the_limit():
    body = json.dumps({"inputs": ["x"] * 1_200_000}).encode()
    assert bodies.too_many_inputs(body, "application/json", 4096)
    assert not bodies.too_many_inputs(body, "application/json", 1_200_000)
    assert bodies.too_many_inputs(b"x\n" * 1_000_000, "text/plain", 10)


def test_long_texts_are_cut_on_the_side_truncation_keeps():
    limit = 4
    most = runtimes.CHARS_PER_TOKEN * limit
    text = "a" * (most + 10) + "END"
    assert runtimes.clip([text], limit) == [text[:most]]
    assert runtimes.clip([text], limit, side="left") == [text[-most:]]
    assert runtimes.clip([("short", text)], limit) == [("short", text[:most])]
    assert runtimes.clip(["short"], limit) == ["short"]


def test_output_fn_never_writes_nan():
    broken = [{"label": "joy", "score": float("nan")}]
    for accept in ("application/json", "application/jsonlines", "text/csv"):
        with pytest.raises(InvalidAnswer, match="NaN or infinity"):
            default_pipeline.output_fn(broken, accept)
    assert json.loads(default_pipeline.output_fn([{"label": "joy", "score": 0.5}], "application/json")[0])
    for vector in ([0.1, float("inf")], [float("-inf")], [[0.5], [float("nan")]]):  # inside a vector too
        with pytest.raises(InvalidAnswer, match="NaN or infinity"):
            default_pipeline.output_fn([vector], "application/json")


def test_json_answers_hold_the_same_values_as_json_writes_them():
    """The answers are written by orjson (fast on an embedding's floats), falling back to json where it
    cannot say the same: what a client reads back equals what json.dumps would have sent."""
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32).tolist()
    values = [
        [vector],
        [{"label": "joy", "score": 0.123456789}, {"label": "null", "score": 1e-17}],  # "null" in a text
        {"object": "list", "data": [{"embedding": vector, "index": 0}], "usage": None},  # a None
        [{"score": np.float64(0.25), "index": np.int64(3).item()}],  # a float subclass: json's own path
        {1: "an int key"},
        [1e16, -0.0, 2**70],  # exponents, a negative zero, an integer past 64 bits
    ]
    for value in values:
        text = default_pipeline.json_text(value)
        assert json.loads(text) == json.loads(json.dumps(value)), value
    with pytest.raises(ValueError):
        default_pipeline.json_text([{"score": np.float64("nan")}])


# --------------------------------------------------------------------------- multi-label and regression


def fake_model(task: str, logits: list[list[float]], id2label: dict[int, str], threshold: float = 0.5) -> dict:
    """What model_fn returns, around fixed logits (one row per input, in request order)."""
    rows = iter(logits)

    def encode(inputs):
        return [{"input_ids": [1, 2], "attention_mask": [1, 1], "token_type_ids": [0, 0]} for _ in inputs]

    def run(feeds):
        return np.array([next(rows) for _ in range(len(feeds["input_ids"]))], dtype=np.float32)

    return {"encode": encode, "logits": run, "id2label": id2label, "pad_id": 0, "task": task, "threshold": threshold}


def test_multi_label_answers_every_label_at_or_above_the_threshold_best_first():
    id2label = {0: "anger", 1: "joy", 2: "love"}
    logits = [[-3.0, 2.0, 0.5], [-3.0, -2.0, -4.0]]  # sigmoid: .05 .88 .62; .05 .12 .02
    ask = lambda parameters: default_pipeline.predict_fn(  # noqa: E731
        {"inputs": ["a", "b"], "parameters": parameters}, fake_model("multi_label_classification", logits, id2label)
    )
    answer = ask({})
    assert [[e["label"] for e in row] for row in answer] == [["joy", "love"], []]
    assert answer[0][0]["score"] == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert [[e["label"] for e in row] for row in ask({"threshold": 0.7})] == [["joy"], []]
    assert [[e["label"] for e in row] for row in ask({"top_k": 1})] == [["joy"], ["joy"]]  # top_k alone: the k best
    assert [[e["label"] for e in row] for row in ask({"top_k": 1, "threshold": 0.5})] == [["joy"], []]
    saved = default_pipeline.predict_fn(
        {"inputs": ["a"], "parameters": {}}, fake_model("multi_label_classification", logits[:1], id2label, 0.7)
    )
    assert [e["label"] for e in saved[0]] == ["joy"]  # the model's own threshold (config.json)
    body, kind = default_pipeline.output_fn(answer, "text/csv")
    assert kind == "text/csv" and body.splitlines()[1] == '""' and body.splitlines()[0].startswith("joy,0.88")


def test_multi_label_labels_with_their_own_thresholds_are_answered_at_them():
    """Tuned thresholds (config.json's byoc_thresholds): joy and love score under the global 0.5 but over
    their own, so both are answered; anger, with none of its own (NaN), keeps the global one; a request's
    threshold is every label's."""
    id2label = {0: "anger", 1: "joy", 2: "love"}
    logits = [[0.0, -1.0, -1.5]]  # sigmoid: .5 .27 .18
    model = {**fake_model("multi_label_classification", logits * 3, id2label), "thresholds": [np.nan, 0.25, 0.15]}
    ask = lambda parameters: [  # noqa: E731
        [e["label"] for e in row]
        for row in default_pipeline.predict_fn({"inputs": ["a"], "parameters": parameters}, model)
    ]
    assert ask({}) == [["anger", "joy", "love"]]
    assert ask({"threshold": 0.2}) == [["anger", "joy"]]
    model["threshold"] = 0.6  # the model's global threshold, set by a model_fn of the user's
    assert ask({}) == [["joy", "love"]]


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_a_model_folder_with_tuned_thresholds_serves_two_labels_under_half(
    tmp_path, tiny_model_dir, monkeypatch, backend
):
    """A multi-label model whose scores are all under 0.5, saved with the thresholds training chose for
    it: an input whose joy and love scores pass their own thresholds gets both labels, on either backend."""
    import torch
    from transformers import AutoModelForSequenceClassification

    names = ["anger", "joy", "love"]
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir,
        num_labels=3,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        problem_type="multi_label_classification",
    )
    with torch.no_grad():  # every text scores sigmoid(bias): .12 .27 .18
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([-2.0, -1.0, -1.5]))
    model.config.byoc_threshold = 0.5
    model.config.byoc_thresholds = {"joy": 0.25, "love": 0.15}
    folder = serve_helpers._publish(model, tiny_model_dir, tmp_path / "model")
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", backend)
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)
    loaded = default_pipeline.model_fn(str(folder))
    assert loaded["backend"] == backend
    answer = default_pipeline.predict_fn({"inputs": ["so happy and in love"], "parameters": {}}, loaded)
    assert [e["label"] for e in answer[0]] == ["joy", "love"]
    assert [e["score"] for e in answer[0]] == pytest.approx([0.2689, 0.1824], abs=1e-3)


@pytest.mark.parametrize(
    "task,parameters,words",
    [
        ("token_classification", {"top_k": 2}, '"top_k" does not apply to a token classifier: its parameters are '),
        ("token_classification", {"threshold": 0.5}, '"threshold" does not apply to a token classifier'),
        ("regression", {"top_k": 2}, '"top_k" does not apply to a regression model: it takes no parameters'),
        ("regression", {"threshold": 0.5}, '"threshold" does not apply to a regression model'),
        ("single_label_classification", {"threshold": 0.5}, "a single-label classifier: its parameters are top_k"),
        ("single_label_classification", {"aggregation_strategy": "none"}, '"aggregation_strategy" does not apply'),
        ("multi_label_classification", {"aggregation_strategy": "max"}, "its parameters are threshold, top_k"),
        ("token_classification", {"truncation_direction": "left"}, '"left" does not apply to a token classifier'),
    ],
)
def test_a_parameter_the_task_does_not_use_is_a_bad_request(task, parameters, words):
    """A token classifier ignored top_k and threshold, a regression model top_k: answered as if applied."""
    model = fake_model(task, [[0.0, 0.0]], {0: "O", 1: "B-PER"})
    with pytest.raises(InputError) as caught:
        default_pipeline.predict_fn({"inputs": ["a text"], "parameters": parameters}, model)
    assert caught.value.status == 400 and words in str(caught.value)
    nulls = {name: None for name in parameters}  # null is not sent
    if task == "token_classification":  # a long text's steps check as one call does
        with pytest.raises(InputError, match="does not apply to a token classifier"):
            long_texts.Stepwise(["a text"], parameters, model)
        assert long_texts.Stepwise(["a text"], nulls, model).request.strategy == "simple"
    else:
        assert len(default_pipeline.predict_fn({"inputs": ["a text"], "parameters": nulls}, model)) == 1


def test_a_left_cut_of_a_model_from_the_users_own_model_fn_is_refused_not_ignored():
    """Its encode is its own (one argument): it cannot be asked to cut on the left."""
    model = fake_model("single_label_classification", [[0.0, 1.0]], {0: "a", 1: "b"})
    with pytest.raises(InputError, match="needs the model byoc's model_fn loads"):
        default_pipeline.predict_fn({"inputs": ["x"], "parameters": {"truncation_direction": "left"}}, model)
    answer = default_pipeline.predict_fn({"inputs": ["x"], "parameters": {"truncation_direction": "Right"}}, model)
    assert answer == [{"label": "b", "score": pytest.approx(0.7311, abs=1e-4)}]


@pytest.mark.parametrize("threshold", [-0.1, 1.5, "0.5", True])
def test_a_threshold_outside_zero_to_one_is_a_bad_request(threshold):
    with pytest.raises(InputError, match="threshold"):
        body = json.dumps({"inputs": "x", "parameters": {"threshold": threshold}})
        default_pipeline.input_fn(body, "application/json")


def test_regression_answers_the_value_named_after_the_target():
    answer = default_pipeline.predict_fn(
        {"inputs": ["a", "b"], "parameters": {}}, fake_model("regression", [[3.25], [-1.5]], {0: "similarity"})
    )
    assert answer == [{"label": "similarity", "score": 3.25}, {"label": "similarity", "score": -1.5}]
    unnamed = default_pipeline.predict_fn(
        {"inputs": ["a"], "parameters": {}}, fake_model("regression", [[0.5]], {0: "LABEL_0"})
    )
    assert unnamed == [{"score": 0.5}]
    assert default_pipeline.output_fn(unnamed, "text/csv")[0] == "0.500000\n"


def test_a_folder_without_a_classifier_head_is_refused_not_served_at_random(tmp_path, tiny_model_dir):
    """A base model loaded as a classifier gets a random head: every answer noise (LABEL_0 at 0.50).
    model_fn refuses it, saying why and what to do (serve it as embeddings, or train it), unless asked."""
    import shutil

    from byoc.serving.backends.backend_choice import BackendError
    from byoc.serving.settings import InferenceSettings

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)  # a BertModel: no classifier weights
    with default_pipeline.serving_with(InferenceSettings(backend="torch", precision="fp32")):
        with pytest.raises(
            BackendError, match=r"no trained classification head.*classifier\.bias, classifier\.weight"
        ) as e:
            default_pipeline.model_fn(str(folder))
    assert "BYOC_TASK=embedding" in str(e.value)
    with default_pipeline.serving_with(InferenceSettings(backend="torch", precision="fp32", allow_untrained_head=True)):
        model = default_pipeline.model_fn(str(folder))
    assert len(default_pipeline.predict_fn({"inputs": ["a cat"], "parameters": {}}, model)) == 1
