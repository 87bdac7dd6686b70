"""Serving a multi-vector (ColBERT) model against a dense one on the same encoder (make bench-multi-vector): the
model alone (byoc's default predict_fn in this process, 32 sentences a call, no HTTP), fp32 on ONNX Runtime,
against sentence-transformers' own `MultiVectorEncoder.encode_document` in the same process at batch 32.

  dense         the bundled all-MiniLM-L6-v2 (mean pooling), its graph written by `byoc export-onnx`
  multi-vector  the same encoder as sentence-transformers 6.2 builds a ColBERT from a plain encoder: a
                128-wide projection (drawn at random: speed only), punctuation skipped in documents, queries
                expanded to 32 tokens, "[unused0] " / "[unused1] " prompts made single tokens (as ColBERT
                checkpoints register their prefix tokens); its graph by byoc. Documents are encoded (each
                text's token vectors in the answer); `--queries` times queries too.

Each phase runs `--seconds` on SICK's sentences, one after another on the same machine; the ratios are the
figures to read (these machines are noisy).

    .venv/bin/python benchmarks/bench_multi_vector.py [--seconds 8] [--json benchmarks/results/multi-vector.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from bench_embed import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's loading and data)
from child_process import exit_on_sigterm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
WORK = Path("/tmp/byoc-bench-multi-vector")
BATCH = 32


def folders() -> dict[str, Path]:
    """The dense and the multi-vector folder, each with its graph."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    shutil.rmtree(WORK, ignore_errors=True)
    dense, colbert = WORK / "dense", WORK / "multi-vector"
    shutil.copytree(bundled_model_dir(), dense)
    from tokenizers import AddedToken

    torch.manual_seed(0)
    encoder = Transformer(str(bundled_model_dir()), query_expansion={"strategy": "fixed", "length": 32})
    prefixes = [AddedToken(token, normalized=False, special=True) for token in ("[unused0]", "[unused1]")]
    encoder.tokenizer.add_special_tokens({"additional_special_tokens": prefixes})  # in the vocabulary already
    projection = Dense(
        384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
    )
    MultiVectorEncoder(
        modules=[encoder, projection, MultiVectorMask(list(string.punctuation)), Normalize("token_embeddings")],
        prompts={"query": "[unused0] ", "document": "[unused1] "},
        device="cpu",
    ).save(str(colbert))
    for folder in (dense, colbert):
        assert onnx_graph.export(folder), folder
    return {"dense": dense, "multi-vector": colbert}


def byoc_rate(model: dict, texts: list[str], side: str, seconds: float) -> float:
    """Sentences/s of the default predict_fn, 32 a call, texts encoded as `side`, in this process."""
    return ceiling(model, texts, seconds, {"prompt_name": side} if model["task"] == "multi_vector" else {})


def reference_rate(folder: Path, multi_vector: bool, texts: list[str], side: str, seconds: float) -> float:
    """Sentences/s of sentence-transformers' own encoding, 32 a call, in this process (answers as numpy)."""
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer

    if multi_vector:
        model = MultiVectorEncoder(str(folder), device="cpu")
        encode = model.encode_query if side == "query" else model.encode_document
    else:
        encode = SentenceTransformer(str(folder), device="cpu").encode
    encode(texts[:BATCH], batch_size=BATCH, convert_to_numpy=True)  # warm-up
    return rate(lambda batch: encode(batch, batch_size=BATCH, convert_to_numpy=True), texts, seconds, BATCH)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--queries", action="store_true", help="time the multi-vector model's queries too")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "multi-vector.json")
    options = parser.parse_args()
    first, second, _ = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    results: dict = {"threads": os.cpu_count(), "batch": BATCH}
    runs = [("dense", "document"), ("multi-vector", "document")] + (
        [("multi-vector", "query")] if options.queries else []
    )
    built = folders()
    for kind, side in runs:
        model = load(built[kind], "fp32")
        byoc_rate(model, texts, side, seconds=1.0)  # warm-up
        ours = byoc_rate(model, texts, side, options.seconds)
        theirs = reference_rate(built[kind], kind == "multi-vector", texts, side, options.seconds)
        name = kind if kind == "dense" else f"{kind} {'queries' if side == 'query' else 'documents'}"
        results[name] = {"byoc": round(ours, 1), "sentence_transformers": round(theirs, 1)}
        print(
            f"{name:24s} byoc {ours:7.1f} sentences/s, sentence-transformers {theirs:7.1f} ({ours / theirs:.2f}x)",
            flush=True,
        )
    documents = results["multi-vector documents"]
    results["multi_vector_over_dense"] = round(documents["byoc"] / results["dense"]["byoc"], 3)
    results["multi_vector_over_sentence_transformers"] = round(
        documents["byoc"] / documents["sentence_transformers"], 3
    )
    print(f"multi-vector / dense (byoc): {results['multi_vector_over_dense']:.2f}x", flush=True)
    harness.write_results(options.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
