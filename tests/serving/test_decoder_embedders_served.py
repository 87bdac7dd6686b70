"""Decoder embedders served: a Qwen3-Embedding-format sentence-transformers folder (a Qwen3 decoder, last-token
pooling over the end-of-text token its tokenizer appends, left padding, an instruction prompt for queries,
Normalize), built tiny and offline, embedded by byoc on torch and on its exported graph (int8 too) as
`SentenceTransformer.encode` embeds it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import architectures
import numpy as np
import pytest

from byoc import onnx_graph
from byoc.serving import default_pipeline
from byoc.serving.protocol import outputs
from byoc.serving.settings import InferenceSettings

pytestmark = pytest.mark.cpu  # compared with sentence-transformers on the CPU at fp32

QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = ["a man plays the guitar", "rain", "the team won the final " * 12, "how to bake bread"]


def qwen3_embedding(target: Path) -> Path:
    """Qwen3-Embedding's layout: the decoder at the root, its tokenizer ending every text with <|endoftext|>
    and padding on the left; Pooling (lasttoken) and Normalize; a query prompt, documents bare."""
    from tokenizers import Tokenizer, processors

    architectures.build("qwen3", target)
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    end = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", end)]
    )
    tokenizer.save(str(target / "tokenizer.json"))
    settings = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": "left"}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    (target / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": architectures.WIDTH, "pooling_mode_lasttoken": True}
    (target / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "pooling_mode_mean_tokens": False}))
    (target / "2_Normalize").mkdir()
    prompts = {"prompts": {"query": QUERY, "document": ""}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (target / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return target


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return qwen3_embedding(tmp_path_factory.mktemp("qwen3-embedding") / "model")


@pytest.fixture(scope="module")
def graph(folder, tmp_path_factory) -> Path:
    target = Path(shutil.copytree(folder, tmp_path_factory.mktemp("qwen3-embedding-onnx") / "model"))
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


def load(folder: Path, backend: str, precision: str = "fp32"):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision=precision)):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    data = default_pipeline.input_fn(json.dumps(body))
    return np.asarray(outputs.shaped(data, default_pipeline.predict_fn(data, model)))


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_qwen3_embedding_folder_embeds_as_sentence_transformers_does(folder, graph, backend):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu")
    assert reference.tokenizer.padding_side == "left"  # (batches of unequal texts: left-padded there)
    model = load(folder if backend == "torch" else graph, backend)
    documents = ask(model, {"inputs": TEXTS})
    assert cosines(documents, reference.encode(TEXTS)).min() >= 0.9999
    queries = ask(model, {"inputs": TEXTS, "prompt_name": "query"})
    assert cosines(queries, reference.encode(TEXTS, prompt_name="query")).min() >= 0.9999
    assert cosines(queries, documents).max() < 0.9999  # the instruction counts
    openai = outputs.shaped(*_openai(model, TEXTS[:2]))
    assert openai["usage"]["prompt_tokens"] == sum(len(reference.tokenize([t])["input_ids"][0]) for t in TEXTS[:2])


def _openai(model, texts: list[str]):
    data = default_pipeline.input_fn(json.dumps({"input": texts, "model": "m"}))
    return data, default_pipeline.predict_fn(data, model)


def test_its_int8_graph_stays_close_to_fp32(graph, tmp_path):
    target = Path(shutil.copytree(graph, tmp_path / "model"))
    assert onnx_graph.export_int8(target) is not None
    fp32, int8 = (
        ask(load(target, "onnxruntime"), {"inputs": TEXTS}),
        ask(load(target, "onnxruntime", "int8"), {"inputs": TEXTS}),
    )
    assert cosines(int8, fp32).min() >= 0.9


def embedding_gemma(target: Path) -> Path:
    """EmbeddingGemma's layout: a Gemma 3 decoder made bidirectional (use_bidirectional_attention), mean
    pooling, two Dense layers (up to 4x the width and back, no bias), Normalize; <bos> and <eos> around each
    text; its task prompts."""
    import torch
    import transformers
    from tokenizers import Tokenizer, processors

    architectures.build("qwen3", target)  # (its byte-level BPE tokenizer; the weights are replaced below)
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    tokenizer.add_special_tokens(["<bos>", "<eos>", "<pad>"])
    bos, eos = tokenizer.token_to_id("<bos>"), tokenizer.token_to_id("<eos>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1", special_tokens=[("<bos>", bos), ("<eos>", eos)]
    )
    tokenizer.save(str(target / "tokenizer.json"))
    settings = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**settings, "pad_token": "<pad>", "bos_token": "<bos>"}))
    config = transformers.Gemma3TextConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=architectures.WIDTH,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=16,
        use_bidirectional_attention=True,
        pad_token_id=tokenizer.token_to_id("<pad>"),
    )
    torch.manual_seed(0)
    for name in ("model.safetensors", "config.json"):
        (target / name).unlink()
    transformers.Gemma3TextModel(config).save_pretrained(target)
    width = architectures.WIDTH
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": width, "pooling_mode_mean_tokens": True})
    )
    from safetensors.torch import save_file

    for name, (in_width, out_width) in (("2_Dense", (width, 4 * width)), ("3_Dense", (4 * width, width))):
        (target / name).mkdir()
        dense = {"in_features": in_width, "out_features": out_width, "bias": False}
        (target / name / "config.json").write_text(
            json.dumps({**dense, "activation_function": "torch.nn.modules.linear.Identity"})
        )
        save_file({"linear.weight": torch.randn(out_width, in_width) * 0.1}, str(target / name / "model.safetensors"))
    (target / "4_Normalize").mkdir()
    prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    (target / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    )
    return target


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_an_embedding_gemma_folder_embeds_as_sentence_transformers_does(tmp_path, backend):
    import transformers

    folder = embedding_gemma(tmp_path / "model")
    if "use_bidirectional_attention" not in transformers.Gemma3TextConfig().to_dict():  # the images' 4.55
        from byoc.serving.backends.backend_choice import BackendError

        with pytest.raises(BackendError, match="bidirectional Gemma 3 .* needs transformers 4.56"):
            load(folder, "torch")  # (it would run causal: refused, not served wrongly)
        assert onnx_graph.export(folder) is None
        return
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu")
    if backend == "onnxruntime":
        assert onnx_graph.export(folder) == folder / onnx_graph.GRAPH
    model = load(folder, backend)
    for prompt in (None, "query", "document"):
        body = {"inputs": TEXTS, **({"prompt_name": prompt} if prompt else {})}
        assert cosines(ask(model, body), reference.encode(TEXTS, prompt_name=prompt)).min() >= 0.9999, prompt
