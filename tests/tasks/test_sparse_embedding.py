"""byoc.tasks.sparse_embedding: a sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling)
served as TEI's embed_sparse answers it, equal to `SparseEncoder.encode`, on torch and on its exported graph; and
the inference-free kind (a Router: a term-weight table for queries, the transformer for documents), equal to
`encode_query` and `encode_document`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from byoc import compat, onnx_graph, sentence_folder, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol.request_errors import InputError, NotAcceptable
from byoc.serving.settings import InferenceSettings
from byoc.tasks.sparse_embedding import splade_settings
from helpers import build_tiny_mlm

pytestmark = pytest.mark.cpu  # terms compared with SparseEncoder's on the CPU at fp32's tolerances

TEXTS = ["A man is playing a guitar.", "the weather is lovely today", "word " * 200]
QUERIES = ["a man plays the guitar", "lovely weather, lovely day", "", "word " * 300]


def build_sparse(tiny_model_dir: Path, target: Path, pooling: str = "max", activation: str = "relu") -> Path:
    """A tiny BERT with a masked-language-model head, saved by sentence-transformers as a SparseEncoder."""
    SparseEncoder, MLMTransformer, SpladePooling, _ = compat.sparse_encoder_api()
    mlm = build_tiny_mlm(tiny_model_dir, target.parent / f"{target.name}-mlm")
    encoder = SparseEncoder(
        modules=[MLMTransformer(str(mlm), max_seq_length=64), SpladePooling(pooling, activation)], device="cpu"
    )
    encoder.save(str(target))
    return target


@pytest.fixture(scope="module")
def sparse(tmp_path_factory, tiny_model_dir) -> Path:
    return build_sparse(tiny_model_dir, tmp_path_factory.mktemp("sparse") / "model")


@pytest.fixture(scope="module")
def sparse_graph(sparse, tmp_path_factory) -> Path:
    target = Path(shutil.copytree(sparse, tmp_path_factory.mktemp("sparse-onnx") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    SparseEncoder = compat.sparse_encoder_api()[0]
    encoded = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True)
    return encoded.to_dense().numpy()


def load(folder: Path, backend: str):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision="fp32")):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    data = default_pipeline.input_fn(json.dumps(body))
    return default_pipeline.predict_fn(data, model)


def dense(answer: list[dict], width: int) -> np.ndarray:
    row = np.zeros(width, dtype=np.float32)
    for term in answer:
        row[term["index"]] = term["value"]
    return row


def test_a_sparse_encoder_folder_is_a_sparse_embedding_model(sparse):
    config = json.loads((sparse / "config.json").read_text())
    assert tasks.of_folder(sparse, config).name == tasks.name_of("splade") == "sparse_embedding"
    assert splade_settings(sparse) == {"pooling": "max", "activation": "relu"}


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_each_texts_terms_are_sparse_encoders(sparse, sparse_graph, backend):
    """The same active terms as SparseEncoder.encode, in vocabulary order, values within 1e-4 relative."""
    model = load(sparse_graph if backend == "onnxruntime" else sparse, backend)
    assert model["backend"] == backend
    expected = reference(sparse, TEXTS)
    answers = ask(model, {"inputs": TEXTS})
    for answer, row in zip(answers, expected):
        indices = [term["index"] for term in answer]
        assert indices == sorted(indices)
        assert set(indices) == set(np.flatnonzero(row > 1e-4)) | (set(indices) & set(np.flatnonzero(row)))
        np.testing.assert_allclose(dense(answer, len(row)), row, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling,activation", [("sum", "relu"), ("max", "log1p_relu")])
def test_the_folders_pooling_and_activation_are_honoured(tiny_model_dir, tmp_path, pooling, activation):
    folder = build_sparse(tiny_model_dir, tmp_path / "model", pooling, activation)
    expected = reference(folder, TEXTS[:2])
    answers = ask(load(folder, "torch"), {"inputs": TEXTS[:2]})
    for answer, row in zip(answers, expected):
        np.testing.assert_allclose(dense(answer, len(row)), row, rtol=1e-4, atol=1e-5)


def test_return_tokens_names_each_term_and_csv_is_refused(sparse):
    model = load(sparse, "torch")
    answer = ask(model, {"inputs": "Paris", "parameters": {"return_tokens": True}})[0]
    vocabulary = json.loads((sparse / "tokenizer.json").read_text())["model"]["vocab"]
    assert all(vocabulary[term["token"]] == term["index"] for term in answer)
    with pytest.raises(InputError, match='"return_tokens" must be true or false'):
        ask(model, {"inputs": "Paris", "parameters": {"return_tokens": "yes"}})
    with pytest.raises(InputError, match='"top_k" does not apply to a sparse embedding model'):
        ask(model, {"inputs": "Paris", "parameters": {"top_k": 2}})
    with pytest.raises(NotAcceptable, match="application/json"):
        default_pipeline.output_fn([answer], "text/csv")


def test_a_sparse_folder_without_splade_pooling_is_refused_naming_it(sparse, tmp_path):
    folder = Path(shutil.copytree(sparse, tmp_path / "model"))
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(sentence_folder.FolderError, match="one SpladePooling module"):
        splade_settings(folder)


@pytest.mark.integration
def test_a_sparse_graph_serves_over_http_in_every_answer_type(sparse_graph, tmp_path):
    """`byoc serve` on the exported folder (the slim image's path: no torch in the answer): JSON, JSON Lines,
    and CSV refused with a 406 that says what to ask for."""
    from serve_helpers import Server

    target = Path(shutil.copytree(sparse_graph, tmp_path / "m" / "model"))
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"})
    s.wait_ready()
    try:
        expected = reference(sparse_graph, TEXTS[:2])
        answer = s.invoke({"inputs": TEXTS[:2]})
        assert answer.status_code == 200, answer.text
        for terms, row in zip(answer.json(), expected):
            np.testing.assert_allclose(dense(terms, len(row)), row, rtol=1e-4, atol=1e-5)
        lines = s.invoke({"inputs": TEXTS[:2]}, accept="application/jsonlines")
        assert lines.status_code == 200 and [json.loads(line) for line in lines.text.splitlines()] == answer.json()
        refused = s.invoke({"inputs": TEXTS[:1]}, accept="text/csv")
        assert refused.status_code == 406 and "application/json" in refused.text
        openai = s.invoke({"input": TEXTS[:1], "model": "m"})
        assert openai.status_code == 400 and "needs an embedding model" in openai.text
    finally:
        s.stop()


@pytest.mark.integration
def test_a_sparse_model_loads_on_a_multi_model_endpoint(sparse_graph, tmp_path):
    from serve_helpers import Server

    (tmp_path / "model").mkdir()
    s = Server(tmp_path / "model", env={"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_PRECISION": "fp32"})
    try:
        s.wait_ready()
        target = Path(shutil.copytree(sparse_graph, tmp_path / "models" / "splade" / "model"))
        assert s.client.post("/models", json={"model_name": "splade", "url": str(target)}).status_code == 200
        answer = s.client.post("/models/splade/invoke", json={"inputs": TEXTS[:1]})
        assert answer.status_code == 200, answer.text
        row = reference(sparse_graph, TEXTS[:1])[0]
        np.testing.assert_allclose(dense(answer.json()[0], len(row)), row, rtol=1e-4, atol=1e-5)
    finally:
        s.stop()


def test_the_int8_graph_keeps_the_terms_that_matter(sparse_graph, tmp_path):
    """int8 (opt-in) changes the weights a little: the strongest terms stay, and the answer's form is the same."""
    folder = Path(shutil.copytree(sparse_graph, tmp_path / "model"))
    assert onnx_graph.export_int8(folder) == folder / onnx_graph.INT8_GRAPH
    with default_pipeline.serving_with(InferenceSettings(backend="onnxruntime", precision="int8")):
        model = default_pipeline.model_fn(str(folder))
    assert model["precision"] == "int8"
    expected = reference(sparse_graph, TEXTS[:2])
    for terms, row in zip(ask(model, {"inputs": TEXTS[:2]}), expected):
        got = dense(terms, len(row))
        top = np.argsort(-row)[:20]
        assert len(set(np.argsort(-got)[:20]) & set(top)) >= 15
        assert float(got @ row / np.linalg.norm(got) / np.linalg.norm(row)) > 0.99


# --- the inference-free kind ------------------------------------------------------------------------------


def build_inference_free(tiny_model_dir: Path, target: Path) -> Path:
    """A Router as sentence-transformers saves an inference-free SPLADE: queries through a SparseStaticEmbedding
    (its weights drawn at random, some zero), documents through the tiny MLM and SpladePooling."""
    import torch

    SparseEncoder, MLMTransformer, SpladePooling, _ = compat.sparse_encoder_api()
    from sentence_transformers.sparse_encoder.models import SparseStaticEmbedding

    try:
        from sentence_transformers.sparse_encoder.models import Router
    except ImportError:  # sentence-transformers 5 (the images' tier)
        from sentence_transformers.models import Router

    mlm = build_tiny_mlm(tiny_model_dir, target.parent / f"{target.name}-mlm")
    document = MLMTransformer(str(mlm), max_seq_length=64)
    static = SparseStaticEmbedding(tokenizer=document.tokenizer, frozen=False)
    torch.manual_seed(0)
    with torch.no_grad():
        static.weight.copy_(torch.rand(static.weight.shape) * (torch.rand(static.weight.shape) > 0.3))
    router = Router.for_query_document(query_modules=[static], document_modules=[document, SpladePooling("max")])
    SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(target))
    return target


@pytest.fixture(scope="module")
def inference_free(tmp_path_factory, tiny_model_dir) -> Path:
    target = build_inference_free(tiny_model_dir, tmp_path_factory.mktemp("inference-free") / "model")
    assert onnx_graph.export(target) == target / "document_0_MLMTransformer" / onnx_graph.GRAPH
    return target


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_an_inference_free_model_serves_queries_from_its_table_and_documents_through_its_transformer(
    inference_free, backend
):
    SparseEncoder = compat.sparse_encoder_api()[0]
    ref = SparseEncoder(str(inference_free), device="cpu")
    model = load(inference_free, backend)
    assert model["task"] == tasks.SPARSE_EMBEDDING and model["backend"] == backend
    for side, encode, texts in (("query", ref.encode_query, QUERIES), ("document", ref.encode_document, TEXTS)):
        expected = encode(texts, convert_to_tensor=True).to_dense().numpy()
        served = ask(model, {"inputs": texts, "parameters": {"prompt_name": side}})
        for answer, row in zip(served, expected):
            assert [t["index"] for t in answer] == np.flatnonzero(row).tolist(), side
            np.testing.assert_allclose(dense(answer, len(row)), row, rtol=1e-4, atol=1e-5, err_msg=side)
    assert ask(model, {"inputs": TEXTS}) == ask(model, {"inputs": TEXTS, "parameters": {"prompt_name": "document"}})
    (terms,) = ask(model, {"inputs": QUERIES[:1], "parameters": {"prompt_name": "query", "return_tokens": True}})
    assert terms and all(t["token"] in QUERIES[0] for t in terms)  # the query's own words, weighed by the table


def test_queries_route_to_the_table_though_the_folder_has_no_query_prompt(inference_free, tmp_path):
    """sentence-transformers' encode_query routes a query to its side, prompt or not."""
    folder = Path(shutil.copytree(inference_free, tmp_path / "model"))
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps({**settings, "prompts": {}}))
    expected = compat.sparse_encoder_api()[0](str(folder), device="cpu").encode_query(
        QUERIES[:2], convert_to_tensor=True
    )
    served = ask(load(folder, "torch"), {"inputs": QUERIES[:2], "parameters": {"prompt_name": "query"}})
    for answer, row in zip(served, expected.to_dense().numpy()):
        np.testing.assert_allclose(dense(answer, len(row)), row, rtol=1e-4, atol=1e-5)


def test_a_router_byoc_does_not_serve_is_refused_naming_its_config(inference_free, tmp_path):
    folder = Path(shutil.copytree(inference_free, tmp_path / "model"))
    config = json.loads((folder / "router_config.json").read_text())
    config["structure"]["query"] = config["structure"]["document"]  # queries through the transformer too
    (folder / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(
        sentence_folder.FolderError, match="router_config.json: routes .* byoc serves an inference-free"
    ):
        load(folder, "torch")


@pytest.mark.integration
def test_byoc_serve_and_a_multi_model_endpoint_serve_an_inference_free_model(inference_free, tmp_path):
    """The exported folder (its graph inside the document transformer's folder) as the slim image serves it: one
    model, and loaded by name on a multi-model endpoint."""
    from serve_helpers import Server

    target = Path(shutil.copytree(inference_free, tmp_path / "one" / "model"))
    model = load(inference_free, "onnxruntime")
    bodies = [{"inputs": QUERIES[:2], "parameters": {"prompt_name": "query"}}, {"inputs": TEXTS[:2]}]
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"})
    try:
        s.wait_ready()
        for body in bodies:
            answer = s.invoke(body)
            assert answer.status_code == 200, answer.text
            assert answer.json() == json.loads(json.dumps(ask(model, body)))
    finally:
        s.stop()
    (tmp_path / "mme" / "model").mkdir(parents=True)
    s = Server(tmp_path / "mme" / "model", env={"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_PRECISION": "fp32"})
    try:
        s.wait_ready()
        loaded = s.client.post("/models", json={"model_name": "free", "url": str(target)})
        assert loaded.status_code == 200, loaded.text
        answer = s.client.post("/models/free/invoke", json=bodies[0])
        assert answer.status_code == 200 and answer.json() == json.loads(json.dumps(ask(model, bodies[0])))
    finally:
        s.stop()


def test_a_request_naming_the_output_the_model_gives_gets_it(sparse):
    """`"output": "sparse"` to a sparse model was a 400 ("does not apply to a sparse embedding model"): a client
    naming the one output a model gives (byoc's name, sentence-transformers' or FlagEmbedding's) gets it; another
    output is refused naming the one there is."""
    from byoc.serving.protocol.request_errors import InputError

    model = load(sparse, "torch")
    plain = ask(model, {"inputs": TEXTS[:2]})
    for name in ("sparse", "sparse_embedding", "lexical_weights"):
        assert ask(model, {"inputs": TEXTS[:2], "parameters": {"output": name}}) == plain, name
    with pytest.raises(InputError, match='"output": a sparse embedding model answers one output, "sparse"'):
        ask(model, {"inputs": TEXTS[:2], "parameters": {"output": "dense"}})
