"""byoc.tasks.multi_vector: a sentence-transformers MultiVectorEncoder folder (Transformer, Dense, MultiVectorMask,
Normalize) served as `MultiVectorEncoder.encode_query` / `encode_document` give its token vectors, on torch and on
its exported graph, and a rerank body scored as its `similarity` (MaxSim) scores."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest

from byoc import onnx_graph, sentence_folder, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings
from byoc.tasks.multi_vector.folder import settings

TEXTS = ["A man is playing a guitar.", "the weather, is lovely today!", "word " * 60, ""]
FIXED = {"strategy": "fixed", "length": 12}
TOKENS = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}  # what 6.2 writes


def multi_vector_api():
    """sentence-transformers' MultiVectorEncoder and its modules (6.2 on): the references. The images' tier holds
    5.1, which has none: its tests serve a folder written as 6.2 writes one (`write_folder`)."""
    try:
        from sentence_transformers import MultiVectorEncoder
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    except ImportError:
        return None
    return MultiVectorEncoder, Transformer, Dense, MultiVectorMask, Normalize


def build(tiny_model_dir: Path, target: Path, expansion=FIXED, prompts=None, similarity="maxsim") -> Path:
    """The tiny BERT as a ColBERT: a 16-wide projection, punctuation skipped in documents, documents cut at 24
    tokens, queries expanded (`expansion`), [unused0] / [unused1] prompts unless `prompts` says otherwise."""
    import torch

    api = multi_vector_api()
    if api is None:
        return write_folder(tiny_model_dir, target, expansion, prompts, similarity)
    MultiVectorEncoder, Transformer, Dense, MultiVectorMask, Normalize = api
    from tokenizers import AddedToken

    torch.manual_seed(1)
    encoder = Transformer(str(tiny_model_dir), document_length=24, query_expansion=expansion)
    # ColBERT checkpoints make their prefixes single tokens: tokenizer.json's added tokens, which byoc reads too
    prefixes = [AddedToken(token, normalized=False, special=True) for token in ("[unused0]", "[unused1]")]
    encoder.tokenizer.add_special_tokens({"additional_special_tokens": prefixes})
    projection = Dense(
        32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
    )
    model = MultiVectorEncoder(
        modules=[
            encoder,
            projection,
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize("token_embeddings"),
        ],
        prompts={"query": "[unused0] ", "document": "[unused1] "} if prompts is None else prompts,
        similarity_fn_name=similarity,
        device="cpu",
    )
    model.save(str(target))
    return target


def write_folder(tiny_model_dir: Path, target: Path, expansion, prompts, similarity) -> Path:
    """The folder `build` makes, written file by file as sentence-transformers 6.2 saves it."""
    import torch
    from safetensors.torch import save_file

    shutil.copytree(tiny_model_dir, target)
    modules = [("", "base.modules.transformer.Transformer"), ("1_Dense", "base.modules.dense.Dense")]
    modules += [("2_MultiVectorMask", "multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask")]
    modules += [("3_Normalize", "base.modules.normalize.Normalize")]
    listed = [
        {"idx": i, "name": str(i), "path": p, "type": "sentence_transformers." + t} for i, (p, t) in enumerate(modules)
    ]
    files = {
        "modules.json": listed,
        "sentence_bert_config.json": {"document_length": 24, "query_expansion": expansion},
        "config_sentence_transformers.json": {
            "model_type": "MultiVectorEncoder",
            "prompts": {"query": "[unused0] ", "document": "[unused1] "} if prompts is None else prompts,
            "default_prompt_name": None,
            "similarity_fn_name": similarity,
        },
        "1_Dense/config.json": {"in_features": 32, "out_features": 16, "bias": False, **TOKENS},
        "2_MultiVectorMask/config.json": {"skiplist_words": list(string.punctuation), "skiplist_tasks": ["document"]},
        "3_Normalize/config.json": TOKENS,
    }
    for name, content in files.items():
        (target / name).parent.mkdir(exist_ok=True)
        (target / name).write_text(json.dumps(content))
    torch.manual_seed(1)
    save_file({"linear.weight": torch.randn(16, 32) / 6}, str(target / "1_Dense" / "model.safetensors"))
    return target


@pytest.fixture(scope="module")
def colbert(tmp_path_factory, tiny_model_dir) -> Path:
    return build(tiny_model_dir, tmp_path_factory.mktemp("colbert") / "model")


@pytest.fixture(scope="module")
def colbert_graph(colbert, tmp_path_factory) -> Path:
    target = Path(shutil.copytree(colbert, tmp_path_factory.mktemp("colbert-onnx") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


def reference(folder: Path):
    api = multi_vector_api()
    if api is None:
        pytest.skip("sentence-transformers before 6.2 has no MultiVectorEncoder (the reference)")
    return api[0](str(folder), device="cpu")


def load(folder: Path, backend: str, precision: str = "fp32"):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision=precision)):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    return default_pipeline.predict_fn(default_pipeline.input_fn(json.dumps(body)), model)


def test_a_multi_vector_encoder_folder_is_a_multi_vector_model(colbert):
    config = json.loads((colbert / "config.json").read_text())
    assert tasks.of_folder(colbert, config).name == tasks.name_of("colbert") == tasks.MULTI_VECTOR
    found = settings(colbert)
    assert found["prompts"] == {"query": "[unused0] ", "document": "[unused1] "}
    assert (found["document_length"], found["query_length"], found["similarity"]) == (24, None, "maxsim")
    assert found["query_expansion"] == {"strategy": "fixed", "attend": False, "token": None, "length": 12}
    assert "," in found["skiplist_words"] and found["skiplist_tasks"] == ["document"]


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_queries_and_documents_get_the_vectors_multi_vector_encoder_gives(colbert, colbert_graph, backend):
    """Each text's token vectors as encode_query and encode_document give them (prompts, query expansion, the
    document length, punctuation skipped in documents), within 1e-5."""
    model = load(colbert_graph if backend == "onnxruntime" else colbert, backend)
    assert model["backend"] == backend
    ref = reference(colbert)
    for side, encode in (("query", ref.encode_query), ("document", ref.encode_document)):
        expected = encode(TEXTS, convert_to_numpy=True)
        served = ask(model, {"inputs": TEXTS, "parameters": {"prompt_name": side}})
        for got, want in zip(served, expected):
            assert np.asarray(got).shape == want.shape, side
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    assert ask(model, {"inputs": TEXTS[:1], "parameters": {"output": "token_embeddings"}}) == ask(
        model, {"inputs": TEXTS[:1], "parameters": {"prompt_name": "document"}}
    )


@pytest.mark.parametrize(
    "expansion, prompts, similarity",
    [
        ({"strategy": "min", "length": 8, "attend": True}, {}, "meanmaxsim"),
        # sentence-transformers adds an empty "document" prompt on load, so encode_document never picks "passage"
        (None, {"query": "query: ", "passage": "passage: ", "title": "title: "}, "maxsim"),
    ],
    ids=["min-attend-meanmaxsim", "no-expansion-passage-prompt"],
)
def test_the_folders_expansion_prompts_and_similarity_are_honoured(
    tiny_model_dir, tmp_path, expansion, prompts, similarity
):
    folder = build(tiny_model_dir, tmp_path / "model", expansion, prompts, similarity)
    ref = reference(folder)
    model = load(folder, "torch")
    for side, encode in (("query", ref.encode_query), ("document", ref.encode_document)):
        served = ask(model, {"inputs": TEXTS, "parameters": {"prompt_name": side}})
        for got, want in zip(served, encode(TEXTS, convert_to_numpy=True)):
            assert np.asarray(got).shape == want.shape, side
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    scores = ask(model, {"query": TEXTS[0], "texts": TEXTS})
    expected = ref.similarity(ref.encode_query(TEXTS[:1]), ref.encode_document(TEXTS))[0].numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_rerank_body_is_scored_by_maxsim(colbert, colbert_graph, backend):
    model = load(colbert_graph if backend == "onnxruntime" else colbert, backend)
    scores = ask(model, {"query": TEXTS[0], "texts": TEXTS})
    queries = ask(model, {"inputs": TEXTS[:1], "parameters": {"prompt_name": "query"}})
    documents = ask(model, {"inputs": TEXTS})
    by_hand = [float((np.asarray(queries[0]) @ np.asarray(d).T).max(axis=1).sum()) for d in documents]
    np.testing.assert_allclose(scores, by_hand, rtol=1e-5)
    if backend == "torch":
        ref = reference(colbert)
        expected = ref.similarity(ref.encode_query(TEXTS[:1]), ref.encode_document(TEXTS))[0].numpy()
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"inputs": ["a"], "parameters": {"prompt_name": "passage"}}, '"prompt_name" is the side a text is encoded as'),
        ({"inputs": ["a"], "parameters": {"output": "sparse"}}, '"output": "token_embeddings" only'),
        ({"inputs": ["a", ["q", "d"]]}, "send all of one kind"),
        ({"input": ["a"], "model": "m"}, "needs an embedding model"),
    ],
)
def test_requests_it_cannot_answer_are_refused_saying_why(colbert, body, words):
    model = load(colbert, "torch")
    with pytest.raises(InputError, match=words):
        ask(model, body)


def test_a_folder_with_modules_byoc_does_not_serve_is_refused_naming_the_file(colbert, tmp_path):
    target = Path(shutil.copytree(colbert, tmp_path / "model"))
    (target / "2_MultiVectorMask" / "config.json").write_text(json.dumps({"keep_only_token_ids": [5]}))
    with pytest.raises(sentence_folder.FolderError, match="2_MultiVectorMask/config.json: keep_only_token_ids"):
        settings(target)
    modules = json.loads((target / "modules.json").read_text())
    modules.insert(
        3, {"idx": 9, "name": "9", "path": "9_Pool", "type": "sentence_transformers.HierarchicalTokenPooling"}
    )
    (target / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(sentence_folder.FolderError, match="token pooling and other modules are not served"):
        settings(target)


def test_a_query_expansion_past_the_models_positions_is_refused_at_load(colbert_graph, tmp_path):
    """An expansion of 600 tokens on a 512-position model loaded, /ping said 200, and every query was a 500: the
    folder is refused as it loads, naming the file and the length to set."""
    target = Path(shutil.copytree(colbert_graph, tmp_path / "model"))
    held = json.loads((target / "config.json").read_text())["max_position_embeddings"]
    path = target / "sentence_bert_config.json"
    config = json.loads(path.read_text())
    config["query_expansion"] = {**(config.get("query_expansion") or {"strategy": "min"}), "length": held + 88}
    path.write_text(json.dumps(config))
    words = f"sentence_bert_config.json: query_expansion .*{held} or less"
    with pytest.raises(sentence_folder.FolderError, match=words):  # (the task's facts: either backend reads them)
        load(target, "onnxruntime")


@pytest.mark.integration
def test_byoc_serve_answers_token_vectors_and_teis_rerank_body(colbert_graph, tmp_path):
    """`byoc serve` on the exported folder (the slim image's path): token vectors, and TEI's rerank answer."""
    from serve_helpers import Server

    target = Path(shutil.copytree(colbert_graph, tmp_path / "m" / "model"))
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"})
    s.wait_ready()
    try:
        model = load(colbert_graph, "onnxruntime")
        vectors = s.invoke({"inputs": TEXTS[:2], "parameters": {"prompt_name": "query"}})
        assert vectors.status_code == 200, vectors.text
        expected = ask(model, {"inputs": TEXTS[:2], "parameters": {"prompt_name": "query"}})
        for got, want in zip(vectors.json(), expected):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
        ranked = s.invoke({"query": TEXTS[0], "texts": TEXTS[:3], "return_text": True})
        assert ranked.status_code == 200, ranked.text
        scores = ask(model, {"query": TEXTS[0], "texts": TEXTS[:3]})
        assert [item["index"] for item in ranked.json()] == list(np.argsort(scores)[::-1])
        assert ranked.json()[0]["text"] == TEXTS[int(np.argmax(scores))]
    finally:
        s.stop()


@pytest.mark.parametrize("normalize", [TOKENS, {}], ids=["tokens-normalized", "normalize-of-sentence-vectors"])
def test_the_folder_written_by_hand_for_the_images_tier_is_one_sentence_transformers_loads(
    tiny_model_dir, tmp_path, normalize
):
    """As written by sentence-transformers 6.2; and with a Normalize that names no input, which normalises a
    sentence vector (its default), not the token vectors: MultiVectorEncoder leaves them as they are, so does byoc."""
    folder = write_folder(tiny_model_dir, tmp_path / "model", FIXED, None, "maxsim")
    (folder / "3_Normalize" / "config.json").write_text(json.dumps(normalize))
    ref = reference(folder)
    model = load(folder, "torch")
    for side, encode in (("query", ref.encode_query), ("document", ref.encode_document)):
        served = ask(model, {"inputs": TEXTS, "parameters": {"prompt_name": side}})
        for got, want in zip(served, encode(TEXTS, convert_to_numpy=True)):
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_the_int8_graph_keeps_each_tokens_direction(colbert_graph, tmp_path):
    """int8 (dynamic quantisation of the exported graph): the same tokens scored, each vector close to fp32's."""
    target = Path(shutil.copytree(colbert_graph, tmp_path / "model"))
    assert onnx_graph.export_int8(target) == target / "model.int8.onnx"
    full, int8 = load(target, "onnxruntime"), load(target, "onnxruntime", "int8")
    assert int8["precision"] == "int8"
    for side in ("query", "document"):
        body = {"inputs": TEXTS, "parameters": {"prompt_name": side}}
        for a, b in zip(ask(full, body), ask(int8, body)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape and (a * b).sum(axis=1).mean() > 0.95, side


def test_an_answer_of_more_token_vectors_than_the_server_answers_is_a_413_before_it_is_built(colbert):
    """Token vectors grow with the tokens: 240 texts of 512 tokens to a 128-wide model answered 324 MB (52 times
    SageMaker's 6 MB). The numbers are counted from each text's own kept tokens before any list is made; over the
    server's BYOC_MAX_ANSWER_VALUES the request is a 413 that names the limit and how to ask for less."""
    from byoc.serving.protocol.request_errors import PayloadTooLarge

    model = load(colbert, "torch")
    texts = [" ".join(["word"] * 30)] * 4  # documents cut at 24 tokens, 16-wide vectors
    answer = ask(model, {"inputs": texts})
    values = sum(len(rows) * len(rows[0]) for rows in answer)
    model.max_answer_values = values
    assert ask(model, {"inputs": texts}) == answer  # at the limit: answered
    model.max_answer_values = values - 1
    with pytest.raises(PayloadTooLarge, match=f"would hold {values:,} numbers .*BYOC_MAX_ANSWER_VALUES"):
        ask(model, {"inputs": texts})
    assert ask(model, {"inputs": texts[:1]})  # fewer texts: answered
    assert len(ask(model, {"query": texts[0], "texts": texts})) == 4  # a rerank answers a score a pair


@pytest.mark.integration
def test_byoc_serve_refuses_a_token_vector_answer_over_its_limit_with_a_413_and_ping_answers(colbert_graph, tmp_path):
    """Over BYOC_MAX_ANSWER_VALUES a request is a 413 (JSON, naming the limit and how to ask for less), /ping
    answers meanwhile, and a request under the limit is answered."""
    import threading

    from serve_helpers import PING_S, Server

    target = Path(shutil.copytree(colbert_graph, tmp_path / "m" / "model"))
    env = {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_MAX_ANSWER_VALUES": "2000"}
    s = Server(target, env=env)
    s.wait_ready()
    try:
        pings: list[int] = []
        stop = threading.Event()

        def ping() -> None:
            while not stop.is_set():
                pings.append(s.client.get("/ping", timeout=PING_S).status_code)

        pinger = threading.Thread(target=ping)
        pinger.start()
        try:
            refused = [s.invoke({"inputs": ["word " * 40] * 64}) for _ in range(3)]
        finally:
            stop.set()
            pinger.join()
        assert all(r.status_code == 413 for r in refused), refused[0].text
        message = refused[0].json()["error"]
        assert "BYOC_MAX_ANSWER_VALUES" in message and "fewer or shorter texts" in message, message
        assert pings and set(pings) == {200}
        assert s.invoke({"inputs": ["word " * 40] * 2}).status_code == 200  # 2 x 24 tokens x 16: under it
    finally:
        s.stop()
