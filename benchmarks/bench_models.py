"""A decoder embedder and a generative reranker served against sentence-transformers' own `encode` and
`CrossEncoder.predict` (make bench-models; issue 58's target: 1.5x in fp32, 2x in int8, batch 32 on the CPU):
Qwen3-0.6B-shaped models (28 layers, 1,024 wide, 16 query and 8 key-value heads, Qwen3's vocabulary size) drawn
at random, with MiniLM's tokenizer. The embedder in Qwen3-Embedding's layout (last-token pooling over the end
token, its [SEP] as Qwen3's <|endoftext|>, Normalize); the reranker in Qwen3-Reranker's (the causal model, its
judge chat template, a LogitScore of "yes" against "no"). Phases one after another on SICK's sentences (the
reranker: its sentence pairs), 32 a call, in this process: sentence-transformers' own, then byoc's default
predict_fn on the graph `byoc export-onnx` writes, fp32 and int8. The ratios are the figures to read (these
machines are noisy). Run it alone.

    .venv/bin/python benchmarks/bench_models.py [--seconds 30] [--layers 28] [--rounds 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # (the reranker layout the tests build)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from child_process import exit_on_sigterm  # noqa: E402
from fixtures import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's model-alone loop)
from generative_rerankers import QWEN3_TEMPLATE, SCORE_TYPE  # noqa: E402

WORK = Path("/tmp/byoc-bench-models")


def qwen3_config(layers: int):  # noqa: ANN201  (transformers' config, imported here)
    import transformers

    return transformers.Qwen3Config(
        vocab_size=151669,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        pad_token_id=0,
    )


def build(layers: int) -> Path:
    """The Qwen3-Embedding-layout folder under WORK, with its graph and int8 graph."""
    import torch
    import transformers

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = WORK / f"qwen3-{layers}" / "model"
    if (target / "model.int8.onnx").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    torch.manual_seed(0)
    transformers.Qwen3Model(qwen3_config(layers)).save_pretrained(target)
    source = bundled_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    (target / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 1024, "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (target / "2_Normalize").mkdir()
    assert onnx_graph.export(target) is not None
    assert onnx_graph.export_int8(target) is not None
    return target


def build_reranker(layers: int) -> Path:
    """The Qwen3-Reranker-layout folder under WORK (MiniLM's tokenizer, which has "yes" and "no", with Qwen3's
    judge template), with its graph and int8 graph."""
    import torch
    import transformers

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = WORK / f"qwen3-reranker-{layers}" / "model"
    if (target / "model.int8.onnx").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    torch.manual_seed(0)
    config = qwen3_config(layers)
    config.architectures = ["Qwen3ForCausalLM"]
    transformers.Qwen3ForCausalLM(config).save_pretrained(target)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_model_dir())
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(target)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_LogitScore", "type": SCORE_TYPE},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "1_LogitScore").mkdir()
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    (target / "1_LogitScore" / "config.json").write_text(json.dumps({"true_token_id": yes, "false_token_id": no}))
    message = {"method": "forward", "method_output_name": "logits"}
    settings = {
        "transformer_task": "text-generation",
        "modality_config": {"text": message, "message": {**message, "format": "flat"}},
        "module_output_name": "causal_logits",
    }
    (target / "sentence_bert_config.json").write_text(json.dumps(settings))
    (target / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
    assert onnx_graph.export(target) is not None
    assert onnx_graph.export_int8(target) is not None
    return target


def reference_rate(model: object, texts: list[str], seconds: float) -> float:
    """Sentences/s of sentence-transformers' own encode, 32 a call (the model freed after)."""
    return rate(lambda batch: model.encode(batch, batch_size=32), texts, seconds)  # type: ignore[attr-defined]


def reranker_rate(model: object, pairs: list[tuple[str, str]], seconds: float) -> float:
    """Pairs/s of sentence-transformers' own CrossEncoder.predict, 32 a call (the model freed after)."""
    return rate(lambda batch: model.predict(batch, batch_size=32), pairs, seconds)  # type: ignore[attr-defined]


def compared(folder: Path, inputs: list, theirs: float, seconds: float, unit: str) -> dict:
    """byoc's rates (fp32, int8) on `inputs` beside sentence-transformers' (`theirs`), and their ratios."""
    results = {"sentence_transformers": round(theirs, 2)}
    for precision in ("fp32", "int8"):
        ours = ceiling(load(folder, precision), inputs, seconds)
        print(f"  byoc {precision}: {ours:.1f} {unit}, {ours / theirs:.2f}x", flush=True)
        results[f"byoc_{precision}"] = round(ours, 2)
        results[f"byoc_{precision}_over_sentence_transformers"] = round(ours / theirs, 3)
    return results


def embedder(layers: int, seconds: float) -> dict:
    """The decoder embedder: sentence-transformers' encode, then byoc's fp32 and int8, on SICK's sentences."""
    from sentence_transformers import SentenceTransformer

    folder = build(layers)
    texts = list(dict.fromkeys(sick_pairs()[0]))
    theirs = reference_rate(SentenceTransformer(str(folder), device="cpu"), texts, seconds)
    print(f"embedder: sentence-transformers encode: {theirs:.1f} sentences/s", flush=True)
    return compared(folder, texts, theirs, seconds, "sentences/s")


def generative_reranker(layers: int, seconds: float) -> dict:
    """The generative reranker: sentence-transformers' CrossEncoder.predict, then byoc's, on SICK's pairs."""
    from sentence_transformers import CrossEncoder

    folder = build_reranker(layers)
    pairs = list(dict.fromkeys(zip(*sick_pairs()[:2])))
    theirs = reranker_rate(CrossEncoder(str(folder), device="cpu"), pairs, seconds)
    print(f"generative reranker: sentence-transformers CrossEncoder.predict: {theirs:.1f} pairs/s", flush=True)
    return compared(folder, pairs, theirs, seconds, "pairs/s")


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    import torch

    threads = torch.get_num_threads()
    results: dict = {"model": f"Qwen3-0.6B-shaped, {opts.layers} layers", "threads": threads, "batch": 32}
    declared = {
        "embedder": lambda: embedder(opts.layers, opts.seconds),
        "generative_reranker": lambda: generative_reranker(opts.layers, opts.seconds),
    }
    results.update(harness.scenarios(declared, opts.rounds))
    results["rounds"] = opts.rounds
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
