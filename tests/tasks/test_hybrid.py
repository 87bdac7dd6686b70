"""byoc.tasks.hybrid: a bge-m3-format folder (an encoder, FlagEmbedding's colbert_linear.pt and sparse_linear.pt
beside it, and the dense sentence-transformers modules bge-m3 ships) served as FlagEmbedding's BGEM3FlagModel
encodes and scores it, on torch and on its exported graph: dense, sparse and ColBERT outputs from one pass, and
pairs (TEI's rerank body) scored as compute_score weighs them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from byoc import onnx_graph, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings
from byoc.tasks.hybrid import COLBERT, SPARSE

pytestmark = pytest.mark.cpu  # answers compared with BGEM3FlagModel's on the CPU at fp32's tolerances

TEXTS = ["A man is playing a guitar.", "the weather, is lovely today!", "word " * 80, "", "a man plays music"]
LENGTH = 64  # the folder's max_seq_length (sentence_bert_config.json): the third text is cut there
PAIRS = [(TEXTS[0], TEXTS[4]), (TEXTS[0], TEXTS[1]), (TEXTS[4], TEXTS[4]), (TEXTS[1], TEXTS[2])]


def build(tiny_model_dir: Path, target: Path, architecture: str = "bert") -> Path:
    """The tiny encoder (BERT, or an XLM-RoBERTa of the same size: bge-m3's) as a bge-m3 folder: its heads seeded
    (the sparse head's bias raised, so that most tokens weigh something), its dense modules (CLS pooling,
    Normalize). The tokenizer names [SEP] its end token, as XLM-R's names </s>: FlagEmbedding's compute_score
    needs one (and leaves its weight out, as byoc must)."""
    from transformers import AutoConfig, XLMRobertaConfig, XLMRobertaModel

    shutil.copytree(tiny_model_dir, target)
    if architecture == "xlm-roberta":
        base = AutoConfig.from_pretrained(tiny_model_dir).to_dict()
        shape = {k: base[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
        config = XLMRobertaConfig(**shape, intermediate_size=64, max_position_embeddings=LENGTH + 2, pad_token_id=0)
        torch.manual_seed(1)
        XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(target)
    width = AutoConfig.from_pretrained(target).hidden_size
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(width, width).state_dict(), target / COLBERT)
    sparse = torch.nn.Linear(width, 1)
    sparse.bias.data += 0.3
    torch.save(sparse.state_dict(), target / SPARSE)
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "eos_token": "[SEP]"}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": LENGTH, "do_lower_case": False}))
    (target / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": width, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (target / "2_Normalize").mkdir()
    return target


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def m3(request, tmp_path_factory, tiny_model_dir) -> Path:
    return build(tiny_model_dir, tmp_path_factory.mktemp(f"m3-{request.param}") / "model", request.param)


@pytest.fixture(scope="module")
def m3_graph(m3, tmp_path_factory) -> Path:
    target = Path(shutil.copytree(m3, tmp_path_factory.mktemp("m3-onnx") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


def reference(folder: Path):
    """FlagEmbedding's BGEM3FlagModel on the folder, in fp32 on the CPU, reading the folder's length."""
    from FlagEmbedding import BGEM3FlagModel

    lengths = {"query_max_length": LENGTH, "passage_max_length": LENGTH}
    try:
        return BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu", **lengths)
    except TypeError:  # FlagEmbedding 1.3 (the images' tier: transformers 4.55) names it `device`
        return BGEM3FlagModel(str(folder), use_fp16=False, device="cpu", **lengths)


def load(folder: Path, backend: str, precision: str = "fp32"):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision=precision)):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    return default_pipeline.predict_fn(default_pipeline.input_fn(json.dumps(body)), model)


def test_a_folder_with_flagembeddings_heads_is_hybrid_though_it_is_a_dense_sentence_folder_too(m3, tmp_path):
    config = json.loads((m3 / "config.json").read_text())
    assert tasks.of_folder(m3, config).name == tasks.name_of("bge-m3") == tasks.HYBRID
    dense_only = Path(shutil.copytree(m3, tmp_path / "model"))
    (dense_only / SPARSE).unlink()
    assert tasks.of_folder(dense_only, config).name == tasks.EMBEDDING  # (bge-m3 served as TEI serves it)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_each_output_is_what_bgem3flagmodel_encodes(m3, m3_graph, backend):
    model = load(m3_graph if backend == "onnxruntime" else m3, backend)
    assert model["task"] == tasks.HYBRID and model["backend"] == backend
    expected = reference(m3).encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    served = ask(model, {"inputs": TEXTS, "parameters": {"output": ["dense", "sparse", "colbert"]}})
    assert ask(model, {"inputs": TEXTS}) == [answer["dense"] for answer in served]  # dense by default, as TEI
    for i, answer in enumerate(served):
        np.testing.assert_allclose(answer["dense"], expected["dense_vecs"][i], atol=1e-5)
        np.testing.assert_allclose(np.asarray(answer["colbert"]), expected["colbert_vecs"][i], atol=1e-5)
        weights = expected["lexical_weights"][i]
        assert [term["index"] for term in answer["sparse"]] == sorted(int(index) for index in weights), i
        np.testing.assert_allclose(
            [term["value"] for term in answer["sparse"]],
            [float(weights[str(term["index"])]) for term in answer["sparse"]],
            rtol=1e-4,
            atol=1e-6,
        )
    assert any(answer["sparse"] for answer in served) and len(served[2]["colbert"]) == LENGTH - 1  # cut, no [CLS]


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_pairs_are_scored_as_compute_score_weighs_them(m3, m3_graph, backend):
    model = load(m3_graph if backend == "onnxruntime" else m3, backend)
    ref = reference(m3)
    lengths = {"max_query_length": LENGTH, "max_passage_length": LENGTH}
    for weights, key, given in (
        (None, "colbert+sparse+dense", None),
        ([0.4, 0.2, 0.4], "colbert+sparse+dense", [0.4, 0.2, 0.4]),
        ([1.0, 0.3, 1.0], "sparse+dense", {"dense": 1.0, "sparse": 0.3}),
        (None, "colbert", {"colbert": 2}),
    ):
        # one pair a call: compute_score pads a batch's passages, whose zero vectors MaxSim then scores as 0
        expected = [ref.compute_score([pair], weights_for_different_modes=weights, **lengths)[key][0] for pair in PAIRS]
        parameters = {"weights": given} if given is not None else {}
        got = ask(model, {"inputs": [list(pair) for pair in PAIRS], "parameters": parameters})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=str(given))
        ranked = ask(model, {"query": TEXTS[0], "texts": TEXTS, "parameters": parameters})
        pairs = ask(model, {"inputs": [[TEXTS[0], text] for text in TEXTS], "parameters": parameters})
        np.testing.assert_allclose(ranked, pairs, rtol=1e-6)


def test_sparse_terms_name_their_tokens_when_asked(m3):
    model = load(m3, "torch")
    (terms,) = ask(model, {"inputs": [TEXTS[0]], "parameters": {"output": "sparse", "return_tokens": True}})
    vocabulary = {index: token for token, index in model["tokenizer"].get_vocab().items()}
    assert terms and all(term["token"] == vocabulary[term["index"]] for term in terms)
    assert "[CLS]" not in {term["token"] for term in terms} and "[SEP]" not in {term["token"] for term in terms}
    (vectors,) = ask(model, {"inputs": [TEXTS[0]], "parameters": {"output": "token_embeddings"}})
    assert np.asarray(vectors).shape[0] == len(model["encode"]([TEXTS[0]])[0]["input_ids"]) - 1


@pytest.mark.parametrize(
    "body, words",
    [
        ({"inputs": ["a"], "parameters": {"output": "tokens"}}, '"output" is one of dense, sparse, colbert'),
        ({"inputs": ["a"], "parameters": {"output": []}}, '"output" is one of'),
        ({"inputs": [["q", "d"]], "parameters": {"weights": [1, 1]}}, '"weights" weighs a pair'),
        ({"inputs": [["q", "d"]], "parameters": {"weights": {"lexical": 1}}}, '"weights" weighs a pair'),
        ({"inputs": [["q", "d"]], "parameters": {"weights": {"dense": 0}}}, "not all 0"),
        ({"inputs": ["a"], "parameters": {"dimensions": 8}}, '"dimensions" does not apply to a hybrid'),
        ({"inputs": ["a"], "parameters": {"normalize": False}}, '"normalize": false: a hybrid model'),
        ({"inputs": [["q", "d"]], "parameters": {"weights": [float("inf"), 1, 1]}}, "finite numbers"),
        ({"inputs": [["q", "d"]], "parameters": {"weights": [10**400, 1, 1]}}, "finite numbers.*\\.\\.\\."),
        ({"query": "q", "texts": ["d"], "parameters": {"output": "dense"}}, '"output" does not apply to a rerank'),
        ({"inputs": ["a", ["q", "d"]]}, "send one kind"),
        ({"inputs": ["a"], "truncation_direction": "left"}, '"left" does not apply to a hybrid .* its own way'),
    ],
)
def test_requests_it_cannot_answer_are_refused_saying_why(m3, body, words):
    model = load(m3, "torch")
    with pytest.raises(InputError, match=words):
        ask(model, body)


def test_weights_of_any_size_weigh_as_their_proportions(m3):
    """A 401-digit integer weight was a 500 (OverflowError), now a 400 (in the parametrized refusals above);
    [5e-324, 0, 0] scored 1.0 where [1, 0, 0] scored the dense score (the weighted sum underflowed before the
    division)."""
    model = load(m3, "torch")

    def score(weights) -> float:
        return ask(model, {"inputs": [[TEXTS[4], TEXTS[0]]], "parameters": {"weights": weights}})[0]

    dense = score([1, 0, 0])
    assert score([5e-324, 0, 0]) == pytest.approx(dense, abs=1e-9)
    assert score([1e308, 1e308, 1e308]) == pytest.approx(score([1, 1, 1]), abs=1e-9)
    assert score({"sparse": 3, "colbert": 1}) == pytest.approx((3 * score([0, 1, 0]) + score([0, 0, 1])) / 4, abs=1e-6)


def test_a_job_refuses_to_train_one_saying_it_is_served_only():
    from byoc.training.arguments import HyperparameterError
    from byoc.training.hyperparameters import parse_hyperparameters

    with pytest.raises(
        HyperparameterError, match=r"task must be auto or one of .*multi_vector.*is served, not trained"
    ):
        parse_hyperparameters({"task": "bge-m3"})


def test_the_int8_graph_keeps_the_order_of_the_scores(m3_graph, tmp_path):
    """int8 (dynamic quantisation of the exported graph): each output close to fp32's, the pairs ranked alike."""
    target = Path(shutil.copytree(m3_graph, tmp_path / "model"))
    assert onnx_graph.export_int8(target) == target / "model.int8.onnx"
    full, int8 = load(target, "onnxruntime"), load(target, "onnxruntime", "int8")
    assert int8["precision"] == "int8"
    body = {"inputs": TEXTS, "parameters": {"output": ["dense", "colbert"]}}
    for a, b in zip(ask(full, body), ask(int8, body)):
        assert float(np.dot(a["dense"], b["dense"])) > 0.95
        assert (np.asarray(a["colbert"]) * np.asarray(b["colbert"])).sum(axis=1).mean() > 0.95
    rerank = {"query": TEXTS[0], "texts": TEXTS}
    assert np.argsort(ask(full, rerank))[-1] == np.argsort(ask(int8, rerank))[-1]


@pytest.mark.integration
def test_byoc_serve_answers_every_output_and_a_weighted_rerank(m3_graph, tmp_path):
    """`byoc serve` on the exported folder (the slim image's path): the outputs, and TEI's rerank answer in the
    order of the weighted scores."""
    from serve_helpers import Server

    target = Path(shutil.copytree(m3_graph, tmp_path / "m" / "model"))
    s = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"})
    s.wait_ready()
    try:
        model = load(m3_graph, "onnxruntime")
        body = {"inputs": TEXTS[:2], "parameters": {"output": ["sparse", "colbert"]}}
        answer = s.invoke(body)
        assert answer.status_code == 200, answer.text
        for got, want in zip(answer.json(), ask(model, body)):
            assert got["sparse"] == want["sparse"] and set(got) == {"sparse", "colbert"}
            np.testing.assert_allclose(np.asarray(got["colbert"]), np.asarray(want["colbert"]), atol=1e-6)
        weights = {"parameters": {"weights": [0.4, 0.2, 0.4]}}
        ranked = s.invoke({"query": TEXTS[0], "texts": TEXTS, "return_text": True, **weights})
        assert ranked.status_code == 200, ranked.text
        scores = ask(model, {"query": TEXTS[0], "texts": TEXTS, **weights})
        assert [item["index"] for item in ranked.json()] == list(np.argsort(scores, kind="stable")[::-1])
        openai = s.invoke({"input": TEXTS[:2], "model": "bge-m3"})  # OpenAI's (and LangChain's) body: dense vectors
        assert openai.status_code == 200, openai.text
        dense = ask(model, {"inputs": TEXTS[:2], "parameters": {"normalize": True}})
        for got, want in zip(openai.json()["data"], dense):
            np.testing.assert_allclose(got["embedding"], want, atol=1e-6)
        assert openai.json()["usage"]["prompt_tokens"] > 0
        refused = s.invoke({"inputs": ["a"], "parameters": {"output": "lexical"}})
        assert refused.status_code == 400 and refused.json()["error"].startswith('"output" is one of')
    finally:
        s.stop()


def test_an_answer_over_the_server_s_limit_is_a_413_counting_each_output(m3):
    """bge-m3's ColBERT vectors answered 81 MB to a 61 KB body; a list of outputs was counted as one value a text.
    Each output of each text is counted before the answer is built."""
    from byoc.serving.protocol.request_errors import PayloadTooLarge

    model = load(m3, "torch")
    body = {"inputs": TEXTS[:3], "parameters": {"output": ["dense", "colbert"]}}
    answer = ask(model, body)
    values = sum(len(a["dense"]) + len(a["colbert"]) * len(a["colbert"][0]) for a in answer)
    model.max_answer_values = values
    assert ask(model, body) == answer
    model.max_answer_values = values - 1
    with pytest.raises(PayloadTooLarge, match=f"would hold {values:,} numbers .*fewer outputs"):
        ask(model, body)
    assert ask(model, {"inputs": TEXTS[:3]})  # the dense vectors alone: answered
