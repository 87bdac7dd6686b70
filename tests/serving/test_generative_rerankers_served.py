"""Generative rerankers served: Qwen3-Reranker- and mxbai-rerank-v2-format folders (tests/generative_rerankers.py),
scored through the rerank body on torch and on their exported graph (int8 too) as sentence-transformers'
`CrossEncoder.predict` scores them: the template rendered, a long document cut with the template's tail kept, the
folder's prompts honoured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import generative_rerankers
import numpy as np
import pytest

from byoc import onnx_graph, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol import outputs
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings

pytestmark = pytest.mark.cpu  # compared with the reference on the CPU at fp32

QUERY = "will it rain tomorrow"
TEXTS = ["rain is expected tomorrow afternoon", "the team won the final", "clouds " * 3, "bake bread at home"]


@pytest.fixture(scope="module", params=generative_rerankers.LAYOUTS)
def folder(request, tmp_path_factory) -> Path:
    return generative_rerankers.build(request.param, tmp_path_factory.mktemp(request.param) / "model")


@pytest.fixture(scope="module")
def graph(folder, tmp_path_factory) -> Path:
    target = Path(shutil.copytree(folder, tmp_path_factory.mktemp("graph") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


def load(folder: Path, backend: str, precision: str = "fp32"):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision=precision)):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    data = default_pipeline.input_fn(json.dumps(body))
    return outputs.shaped(data, default_pipeline.predict_fn(data, model))


def ranked(answer: list[dict]) -> np.ndarray:
    return np.asarray([entry["score"] for entry in sorted(answer, key=lambda e: e["index"])])


def test_the_folder_is_a_generative_reranker(folder):
    config = json.loads((folder / "config.json").read_text())
    assert tasks.of_folder(folder, config).name == tasks.GENERATIVE_RERANKER
    assert tasks.cross_encoder_activation(folder, config) == "Sigmoid"


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_it_reranks_as_sentence_transformers_scores(folder, graph, backend):
    model = load(folder if backend == "torch" else graph, backend)
    assert model["task"] == tasks.GENERATIVE_RERANKER
    expected = np.asarray(generative_rerankers.reference_logits(folder, [(QUERY, t) for t in TEXTS]))
    raw = ranked(ask(model, {"query": QUERY, "texts": TEXTS, "raw_scores": True}))
    np.testing.assert_allclose(raw, expected, atol=1e-4)
    assert np.ptp(raw) > 1e-3  # the documents count: not one score for all
    probabilities = ranked(ask(model, {"query": QUERY, "texts": TEXTS}))
    np.testing.assert_allclose(probabilities, 1 / (1 + np.exp(-expected)), atol=1e-5)
    pairs = ask(model, {"inputs": [[QUERY, t] for t in TEXTS]})  # a pair body: the raw logit, as a cross-encoder's
    np.testing.assert_allclose([a["score"] for a in pairs], expected, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_prompt_is_the_templates_system_message(folder, graph, backend):
    model = load(folder if backend == "torch" else graph, backend)
    if not model["prompts"]:  # (the mxbai layout has none)
        with pytest.raises(InputError, match="'weather' is not one of the model's prompts"):
            ask(model, {"query": QUERY, "texts": TEXTS, "parameters": {"prompt_name": "weather"}})
        return
    pairs = [(QUERY, t) for t in TEXTS]
    expected = generative_rerankers.reference_logits(folder, pairs, prompt=generative_rerankers.INSTRUCT)
    body = {"query": QUERY, "texts": TEXTS, "raw_scores": True, "parameters": {"prompt_name": "weather"}}
    raw = ranked(ask(model, body))
    np.testing.assert_allclose(raw, expected, atol=1e-4)
    assert np.abs(raw - generative_rerankers.reference_logits(folder, pairs)).max() > 1e-4  # the prompt counts


@pytest.mark.skipif(not generative_rerankers.has_logit_score(), reason="sentence-transformers 5.4+ restores the tail")
@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_document_past_the_length_keeps_the_templates_tail(folder, graph, backend):
    model = load(folder if backend == "torch" else graph, backend)
    long = "rain falls on the hills and the rivers rise " * 80  # far past 512 tokens
    documents = [long, "short rain", long + "snow"]
    expected = generative_rerankers.reference_logits(folder, [(QUERY, d) for d in documents])
    raw = ranked(ask(model, {"query": QUERY, "texts": documents, "raw_scores": True}))
    np.testing.assert_allclose(raw, expected, atol=1e-4)


def test_a_single_text_or_a_left_cut_is_refused(graph):
    model = load(graph, "onnxruntime")
    with pytest.raises(InputError, match=r"scores \(query, document\) pairs: input 1 is a single text"):
        ask(model, {"inputs": [[QUERY, "rain"], "rain"]})
    with pytest.raises(InputError, match="truncation_direction.*keeps its template's"):
        ask(model, {"query": QUERY, "texts": TEXTS, "truncation_direction": "left"})


def test_int8_keeps_the_ranking_close(graph, tmp_path):
    target = Path(shutil.copytree(graph, tmp_path / "model"))
    assert onnx_graph.export_int8(target) is not None
    body = {"query": QUERY, "texts": TEXTS, "raw_scores": True}
    fp32, int8 = ranked(ask(load(target, "onnxruntime"), body)), ranked(ask(load(target, "onnxruntime", "int8"), body))
    assert np.abs(int8 - fp32).max() < 0.1 * max(1.0, float(np.abs(fp32).max()))


def test_a_folder_without_a_template_says_how_to_give_it_one(folder, tmp_path):
    target = Path(shutil.copytree(folder, tmp_path / "model"))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((target / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(Exception, match="renders each \\(query, document\\) pair with its chat template"):
        load(target, "torch")


def test_a_folder_without_sentence_transformers_settings_serves_with_their_defaults(folder, tmp_path):
    """sentence_bert_config.json is optional (a hand-made folder): the template's settings are then its own."""
    target = Path(shutil.copytree(folder, tmp_path / "model"))
    (target / "sentence_bert_config.json").unlink()
    body = {"query": QUERY, "texts": TEXTS, "raw_scores": True}
    np.testing.assert_allclose(ranked(ask(load(target, "torch"), body)), ranked(ask(load(folder, "torch"), body)))
