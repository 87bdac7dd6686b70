"""The folders `byoc train` writes, `code/` included, served through every body shape a client sends
(issue 55, finding 1). Each model carries the template code/inference.py, whose predict_fn wraps the
default one: the server used to apply the text limit, NER's long-text steps and the rerank and OpenAI
answer shapes only where predict_fn *was* the default, so a trained NER model read a 2 M-character text
for 22 s, a trained pair model answered a rerank body with bare floats in input order, and a trained
embedding model answered OpenAI's body with a bare list of vectors. Tests built their models without
code/ and never saw it. Here: the real job's folder, as is, and an edited copy of its template (a model's
own predict_fn), which must keep the limits and the shapes too."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import serve_helpers
from serve_helpers import Server

from helpers import Job, conll_sentences, run_train_process, topic_rows, write_jsonl

pytestmark = pytest.mark.integration  # real jobs and servers in processes

QUICK = {"max_steps": "8", "logging_steps": "4", "learning_rate": "5e-3", "per_device_train_batch_size": "8"}
PAIRS = [
    (f"what is {w}", f"{w} is a {k}", label)
    for w, k, label in [
        ("red", "colour", 1),
        ("a cat", "stone", 0),
        ("rain", "weather", 1),
        ("a dog", "number", 0),
    ]
    * 8
]


def train(tmp_path_factory, name: str, tiny_model_dir: Path, hyperparameters: dict, write) -> Path:
    """A model folder written by the real `byoc train` (its own process), code/ and all."""
    root = tmp_path_factory.mktemp(name) / "opt-ml"
    job = Job(root).resources()
    job.hyperparameters({**QUICK, **hyperparameters})
    job.model_channel(tiny_model_dir)
    write(job.channel("train"))
    done = run_train_process(root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (job.model_dir / "code" / "inference.py").exists() and (job.model_dir / "model.onnx").exists()
    return job.model_dir


@pytest.fixture(scope="module")
def ner(tmp_path_factory, tiny_model_dir) -> Path:
    return train(
        tmp_path_factory, "ner", tiny_model_dir, {}, lambda d: (d / "train.conll").write_text(conll_sentences(32))
    )


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tiny_model_dir) -> Path:
    rows = [{"sentence1": a, "sentence2": b, "label": label} for a, b, label in PAIRS]
    return train(tmp_path_factory, "pairs", tiny_model_dir, {}, lambda d: write_jsonl(d / "train.jsonl", rows))


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tiny_model_dir) -> Path:
    return train(
        tmp_path_factory,
        "embedder",
        tiny_model_dir,
        {"task": "embedding"},
        lambda d: write_jsonl(d / "train.jsonl", topic_rows(32)),
    )


def serve(model_dir: Path, tmp_path: Path, edited: bool, **env: str) -> Server:
    """The folder as the job wrote it, or with its template edited (one comment added: a model's own code)."""
    if edited:
        source = (model_dir / "code" / "inference.py").read_text() + "\n# my own change\n"
        target = serve_helpers.model_with_code(model_dir, tmp_path, source)
    else:
        target = tmp_path / "opt-ml" / "model"
        shutil.copytree(model_dir, target)
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", **env})
    s.wait_ready()
    return s


@pytest.mark.parametrize("edited", [False, True], ids=["as-trained", "edited-template"])
def test_a_trained_ner_model_keeps_the_text_limit_and_every_body(ner, tmp_path, edited):
    s = serve(ner, tmp_path, edited, BYOC_MAX_TEXT_CHARS_PER_REQUEST="20000")
    try:
        assert ("template, unchanged" in s.log()) != edited  # the server says which handlers serve
        huge = s.invoke({"inputs": "john smith lives in paris now " * 1000})  # 30,000 characters
        assert huge.status_code == 413 and "BYOC_MAX_TEXT_CHARS_PER_REQUEST" in huge.json()["error"]
        long = s.invoke({"inputs": ["mary smith lives in oslo now " * 100]})  # 2,900: run in steps, as trained
        assert long.status_code == 200 and isinstance(long.json()[0], list)
        one = s.invoke({"inputs": ["john smith lives in paris now"]}).json()
        assert all({"entity_group", "score", "word", "start", "end"} <= set(e) for e in one[0])
        lines = s.invoke("john smith lives in paris now\n", "text/plain", accept="application/jsonlines")
        assert lines.status_code == 200 and json.loads(lines.text.splitlines()[0]) == one[0]
        rerank = s.invoke({"query": "who", "texts": ["john smith", "paris"]})
        assert rerank.status_code == 400 and "a token classifier does not rerank" in rerank.json()["error"]
        openai = s.invoke({"input": ["john"], "model": "m"})
        assert openai.status_code == 400 and "needs an embedding model" in openai.json()["error"]
    finally:
        s.stop()


@pytest.mark.parametrize("edited", [False, True], ids=["as-trained", "edited-template"])
def test_a_trained_pair_classifier_reranks_sorted_with_indices(pairs, tmp_path, edited):
    s = serve(pairs, tmp_path, edited)
    try:
        texts = ["red is a colour", "a cat is a stone", "rain is weather"]
        scores = [
            s.invoke({"inputs": [{"text": "what is red", "text_pair": t}]}).json()[0] for t in texts
        ]  # the classifier's own answers: {"label", "score"} of its best label
        assert all({"label", "score"} == set(a) for a in scores)
        ranked = s.invoke({"query": "what is red", "texts": texts, "top_n": 2, "return_text": True})
        assert ranked.status_code == 200
        entries = ranked.json()
        assert len(entries) == 2 and all({"index", "score", "text"} == set(e) for e in entries)
        assert entries[0]["score"] >= entries[1]["score"] and entries[0]["text"] == texts[entries[0]["index"]]
        every = s.invoke({"query": "what is red", "texts": texts}).json()
        assert sorted(e["index"] for e in every) == [0, 1, 2]
        assert [e["score"] for e in every] == sorted((e["score"] for e in every), reverse=True)
        as_csv = s.invoke({"query": "what is red", "texts": texts}, accept="text/csv")
        assert as_csv.status_code == 200 and len(as_csv.text.splitlines()) == 3
        shaped = s.invoke({"inputs": ["hello world", "bye now"], "parameters": {"shape": "rerank"}})
        assert shaped.status_code == 200 and all("label" in a for a in shaped.json())  # the client cannot set it
        bad = s.invoke({"query": "q", "texts": ["fine", None]})
        assert bad.status_code == 400 and '"texts"[1] is null' in bad.json()["error"]
    finally:
        s.stop()


@pytest.mark.parametrize("edited", [False, True], ids=["as-trained", "edited-template"])
def test_a_trained_embedding_model_answers_openai_bodies_in_openais_shape(embedder, tmp_path, edited):
    s = serve(embedder, tmp_path, edited)
    try:
        texts = ["a recipe for bread", "the team won the final"]
        vectors = np.asarray(s.invoke({"inputs": texts}).json(), dtype=np.float32)
        body = s.invoke({"input": texts, "model": "null"}).json()
        assert body["object"] == "list" and body["model"] == "null"
        assert [d["index"] for d in body["data"]] == [0, 1]
        np.testing.assert_allclose([d["embedding"] for d in body["data"]], vectors, atol=1e-6)
        if not edited:  # counted where the texts were tokenized: [CLS] and [SEP] around the words
            assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] >= 2 * (4 + 2)
        packed = s.invoke({"input": texts, "model": "m", "encoding_format": "base64"}).json()
        decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in packed["data"]]
        np.testing.assert_allclose(decoded, vectors, atol=1e-6)
        as_csv = s.invoke({"inputs": texts}, accept="text/csv")
        assert as_csv.status_code == 200 and len(as_csv.text.splitlines()[0].split(",")) == vectors.shape[1]
        rerank = s.invoke({"query": "bread", "texts": texts})
        assert rerank.status_code == 400 and "an embedding model does not rerank" in rerank.json()["error"]
    finally:
        s.stop()


def test_the_trained_folders_carry_the_template_the_server_knows_and_say_if_they_read_pairs(ner, pairs, embedder):
    from byoc.serving.user_code.handler_loader import shipped_template

    for folder in (ner, pairs, embedder):
        assert shipped_template(folder / "code" / "inference.py"), folder
    assert json.loads((pairs / "config.json").read_text())["byoc_pairs"] is True
    assert json.loads((ner / "config.json").read_text())["byoc_pairs"] is False
