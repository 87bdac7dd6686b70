"""`byoc serve` over real HTTP for every task: multi-label and regression models answer in the Hugging
Face inference DLC's shapes in every content type, on ONNX Runtime fp32 and int8, alone and side by
side with a single-label model in one multi-model endpoint."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import serve_helpers
import torch
from serve_helpers import TEXTS, Server
from transformers import AutoModelForSequenceClassification, AutoTokenizer

pytestmark = pytest.mark.integration  # servers in processes

MULTI, REGRESSION = "multi_label_classification", "regression"


@pytest.fixture(scope="module")
def multi_label(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, MULTI)


@pytest.fixture(scope="module")
def regression(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, REGRESSION)


@pytest.fixture(scope="module")
def ner(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, "token_classification")


def direct_logits(model_dir: Path, texts: list[str]) -> np.ndarray:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    encoded = AutoTokenizer.from_pretrained(model_dir)(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        return model(**encoded).logits.numpy()


def serve(model_dir: Path, tmp_path: Path, **env: str) -> Server:
    """The model at tmp_path/<name>/model, where SageMaker puts it (SAGEMAKER_BASE_DIR/model)."""
    target = tmp_path / model_dir.name / "model"
    shutil.copytree(model_dir, target)
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", **env})
    s.wait_ready()
    return s


def test_a_multi_label_model_answers_its_labels_above_the_threshold(multi_label, tmp_path):
    scores = 1 / (1 + np.exp(-direct_logits(multi_label, TEXTS)))
    expected = [[("anger", "joy", "love")[j] for j in np.argsort(-row) if row[j] >= 0.3] for row in scores]
    s = serve(multi_label, tmp_path)
    try:
        answer = s.invoke({"inputs": TEXTS})
        assert answer.status_code == 200
        assert [[e["label"] for e in row] for row in answer.json()] == expected
        flat = [e["score"] for row in answer.json() for e in row]
        above = [float(v) for row in scores for v in sorted(row, reverse=True) if v >= 0.3]
        assert flat == pytest.approx(above, abs=1e-4)
        every = s.invoke({"inputs": TEXTS, "parameters": {"threshold": 0.0}}).json()
        assert all(len(row) == 3 for row in every)
        assert s.invoke({"inputs": TEXTS, "parameters": {"threshold": 1.0}}).json() == [[] for _ in TEXTS]
        bad = s.invoke({"inputs": "x", "parameters": {"threshold": 2}})
        assert bad.status_code == 400 and "threshold" in bad.text
        lines = "\n".join(json.dumps({"inputs": t}) for t in TEXTS)
        jl = s.invoke(lines, "application/jsonlines", accept="application/jsonlines")
        assert [json.loads(line) for line in jl.text.splitlines()] == answer.json()
        csv = s.invoke("\n".join(TEXTS), "text/csv", accept="text/csv")
        assert csv.status_code == 200 and len(csv.text.splitlines()) == len(TEXTS)  # a line per input, even empty
    finally:
        s.stop()


def test_a_regression_model_answers_its_value(regression, tmp_path):
    values = direct_logits(regression, TEXTS).reshape(-1)
    s = serve(regression, tmp_path)
    try:
        answer = s.invoke({"inputs": TEXTS}).json()
        assert [a["label"] for a in answer] == ["similarity"] * len(TEXTS)
        assert [a["score"] for a in answer] == pytest.approx(values.tolist(), abs=1e-4)
        csv = s.invoke("\n".join(TEXTS), "text/csv", accept="text/csv").text.splitlines()
        assert [float(line.split(",")[1]) for line in csv] == pytest.approx(values.tolist(), abs=1e-5)
        pair = s.invoke({"inputs": [{"text": "a dog runs", "text_pair": "a dog is running"}]})
        assert pair.status_code == 200 and set(pair.json()[0]) == {"label", "score"}
        top_k = s.invoke({"inputs": TEXTS, "parameters": {"top_k": 2}})  # was ignored: one value each
        assert top_k.status_code == 400 and '"top_k" does not apply to a regression model' in top_k.json()["error"]
    finally:
        s.stop()


def test_a_token_classifier_answers_the_pipelines_entities_and_covers_long_texts(ner, tmp_path):
    from transformers import pipeline

    texts = ["John Smith lives in Paris", "word " * 300 + "and the end"]  # the second: several windows
    reference = pipeline("token-classification", model=str(ner), device="cpu")
    s = serve(ner, tmp_path, BYOC_MAX_TEXT_CHARS_PER_REQUEST="3000")
    try:
        answer = s.invoke({"inputs": texts[:1], "parameters": {"aggregation_strategy": "none"}})
        assert answer.status_code == 200
        expected = reference(texts[:1], aggregation_strategy="none")[0]
        assert [(e["entity"], e["start"], e["end"]) for e in answer.json()[0]] == [
            (e["entity"], e["start"], e["end"]) for e in expected
        ]
        every = s.invoke({"inputs": texts[1], "parameters": {"aggregation_strategy": "none"}}).json()[0]
        ends = [e["end"] for e in every]
        assert ends == sorted(ends) and len(set(ends)) == len(ends)  # each token once, in order
        # The tiny model has 128 positions: tokens far past the first window are answered too (its random
        # head tags most tokens, so some of them lie there).
        assert every and max(ends) > len("word " * 200)
        lines = s.invoke(json.dumps({"inputs": texts[0]}), "application/jsonlines", accept="application/jsonlines")
        assert lines.status_code == 200 and isinstance(json.loads(lines.text.splitlines()[0]), list)
        refused = s.invoke({"inputs": texts[0]}, accept="text/csv")
        assert refused.status_code == 406 and "application/json" in refused.text
        empty = s.invoke({"inputs": ""})
        assert empty.status_code == 400 and "empty" in empty.text
        pair = s.invoke({"inputs": [{"text": "a", "text_pair": "b"}]})
        assert pair.status_code == 400 and "pair" in pair.text
        # top_k and threshold were ignored; refused in one call and in a long text's steps (over 2,048 characters).
        for parameters in ({"top_k": 2}, {"threshold": 0.5}):
            for text in (texts[0], "word " * 500):
                wrong = s.invoke({"inputs": text, "parameters": parameters})
                assert wrong.status_code == 400 and "its parameters are aggregation_strategy" in wrong.text
        # A CSV row of several unquoted fields is one text (it was a 400 "not a pair"); a quoted field is CSV's.
        line = "John Smith, of Paris"
        csv = s.invoke(f'{line}\n"Smith, John"\n', "text/csv")
        assert csv.status_code == 200, csv.text
        assert csv.json() == s.invoke({"inputs": [line, "Smith, John"]}).json()  # offsets into the line as sent
        # Every window of a text runs: the work one request causes is bounded by its characters, all texts
        # together (a 5.8 MB text held the endpoint for 40 s), refused before it queues.
        for too_long in ({"inputs": "a" * 3001}, {"inputs": ["b " * 800, "c " * 800]}):
            refused = s.invoke(too_long)
            assert refused.status_code == 413, refused.text
            assert "BYOC_MAX_TEXT_CHARS_PER_REQUEST" in refused.text and "3000" in refused.text
        assert s.invoke({"inputs": ["b " * 700, "c " * 800]}).status_code == 200  # 3000 exactly
    finally:
        s.stop()


def model_calls(s: Server) -> float:
    """Calls to the model so far (each step of a long text is one), from /metrics."""
    scrape = s.client.get("/metrics").text
    return sum(float(n) for n in re.findall(r"^byoc_inference_seconds_count\{[^}]*\} (\S+)$", scrape, re.M))


def test_a_long_text_shares_the_model_with_small_requests(ner, tmp_path):
    """One long text held the endpoint: a 5.8 MB text took 40 s and a small request sent a second later
    waited as long. Its windows run a few at a time, other requests between them."""
    text = " ".join(["John Smith lives in Paris"] * 24_000)  # 600k characters: hundreds of steps
    s = serve(ner, tmp_path, BYOC_MAX_TEXT_CHARS_PER_REQUEST="1000000")
    try:
        before = model_calls(s)
        long: dict = {}
        thread = threading.Thread(target=lambda: long.update(answer=s.invoke({"inputs": text})))
        thread.start()
        serve_helpers.wait_for(lambda: model_calls(s) >= before + 3, "the long text's first steps", every=0.005)
        small = s.invoke({"inputs": ["John lives in Paris"]})
        answered_first = thread.is_alive()
        assert s.client.get("/ping").status_code == 200
        thread.join(serve_helpers.HANG_GUARD_S)
        assert small.status_code == 200 and long["answer"].status_code == 200
        assert answered_first, "the small request waited for the whole long text"
        entities = long["answer"].json()[0]
        assert entities and entities[-1]["end"] <= len(text)
    finally:
        s.stop()


def test_int8_serves_every_task(multi_label, regression, tmp_path):
    """The int8 graph (quantized at start) keeps every output: the labels and values stay close."""
    for model_dir in (multi_label, regression):
        s = serve(model_dir, tmp_path, BYOC_INFERENCE_PRECISION="int8")
        try:
            parameters = {} if model_dir == regression else {"threshold": 0.0}  # a regression takes none
            answer = s.invoke({"inputs": TEXTS, "parameters": parameters}).json()
        finally:
            s.stop()
        logits = direct_logits(model_dir, TEXTS)
        if model_dir == regression:
            assert [a["score"] for a in answer] == pytest.approx(logits.reshape(-1).tolist(), abs=0.1)
        else:
            probs = 1 / (1 + np.exp(-logits))
            got = [{e["label"]: e["score"] for e in row} for row in answer]
            for row, expected in zip(got, probs):
                assert [row[name] for name in ("anger", "joy", "love")] == pytest.approx(expected.tolist(), abs=0.05)


@pytest.fixture(scope="module")
def single_label(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)


def test_one_multi_model_endpoint_serves_every_task(single_label, multi_label, regression, ner, tmp_path):
    single = single_label
    (tmp_path / "model").mkdir()
    s = Server(tmp_path / "model", env={"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"})
    s.wait_ready()
    try:
        for name, folder in (("single", single), ("multi", multi_label), ("value", regression), ("ner", ner)):
            target = tmp_path / "models" / name / "model"
            shutil.copytree(folder, target)
            loaded = s.client.post("/models", json={"model_name": name, "url": str(target)})
            assert loaded.status_code == 200, loaded.text
        ask = lambda name: s.client.post(f"/models/{name}/invoke", json={"inputs": TEXTS[:2]}).json()  # noqa: E731
        assert all(set(a) == {"label", "score"} and a["label"] in ("negative", "positive") for a in ask("single"))
        assert all(isinstance(row, list) for row in ask("multi"))
        assert [a["label"] for a in ask("value")] == ["similarity", "similarity"]
        assert all(isinstance(row, list) and all("entity_group" in e for e in row) for row in ask("ner"))
    finally:
        s.stop()
