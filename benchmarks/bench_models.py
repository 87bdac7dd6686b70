"""A decoder embedder served against sentence-transformers' own `encode` (make bench-models; issue 58's target:
1.5x in fp32, 2x in int8, batch 32 on the CPU): a Qwen3-0.6B-shaped model (28 layers, 1,024 wide, 16 query
and 8 key-value heads, Qwen3's vocabulary size) drawn at random, in Qwen3-Embedding's layout (last-token
pooling over the end token, Normalize), with MiniLM's tokenizer (its [SEP] ends each text, as Qwen3's
<|endoftext|>). Phases one after another on SICK's sentences, 32 a call, in this process: sentence-transformers'
`encode`, then byoc's default predict_fn on the graph `byoc export-onnx` writes, fp32 and int8. The ratios are
the figures to read (these machines are noisy). Run it alone.

    .venv/bin/python benchmarks/bench_models.py [--seconds 30] [--layers 28] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_embed import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's model-alone loop)
from child_process import exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-models")


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
    config = transformers.Qwen3Config(
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
    torch.manual_seed(0)
    transformers.Qwen3Model(config).save_pretrained(target)
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


def reference_rate(model: object, texts: list[str], seconds: float) -> float:
    """Sentences/s of sentence-transformers' own encode, 32 a call (the model freed after)."""
    return rate(lambda batch: model.encode(batch, batch_size=32), texts, seconds)  # type: ignore[attr-defined]


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    folder = build(opts.layers)
    texts = list(dict.fromkeys(sick_pairs()[0]))
    threads = torch.get_num_threads()
    theirs = reference_rate(SentenceTransformer(str(folder), device="cpu"), texts, opts.seconds)
    print(f"sentence-transformers encode: {theirs:.1f} sentences/s", flush=True)
    results = {"model": f"Qwen3-0.6B-shaped, {opts.layers} layers", "threads": threads, "batch": 32}
    results["sentence_transformers"] = round(theirs, 2)
    for precision in ("fp32", "int8"):
        ours = ceiling(load(folder, precision), texts, opts.seconds)
        print(f"byoc {precision}: {ours:.1f} sentences/s, {ours / theirs:.2f}x", flush=True)
        results[f"byoc_{precision}"] = round(ours, 2)
        results[f"byoc_{precision}_over_sentence_transformers"] = round(ours / theirs, 3)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
