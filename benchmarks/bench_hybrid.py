"""Serving a hybrid (bge-m3-format) model against a dense one on the same encoder (make bench-hybrid): the model
alone (byoc's default predict_fn in this process, 32 sentences a call, no HTTP), fp32 on ONNX Runtime, against
FlagEmbedding's own `BGEM3FlagModel.encode` (and sentence-transformers' `encode` for the dense one) in the same
process at batch 32.

  dense   the bundled all-MiniLM-L6-v2 (mean pooling), its graph written by `byoc export-onnx`
  hybrid  the same encoder in bge-m3's format: FlagEmbedding's two heads beside it (a 384-wide ColBERT
          projection and a term-weight layer, drawn at random: speed only; the term layer's bias raised so
          that most tokens weigh something, as a trained model's do), its graph by byoc. Timed asking for the
          three outputs (dense, sparse, ColBERT: what BGEM3FlagModel.encode returns with every return_* set),
          and for the dense vectors alone.

Each phase runs `--seconds` on SICK's sentences, one after another on the same machine; the ratios are the
figures to read (these machines are noisy).

    .venv/bin/python benchmarks/bench_hybrid.py [--seconds 8] [--json benchmarks/results/hybrid.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from bench_embed import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's loading and data)
from child_process import exit_on_sigterm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
WORK = Path("/tmp/byoc-bench-hybrid")
BATCH = 32
ALL = ["dense", "sparse", "colbert"]


def folders() -> dict[str, Path]:
    """The dense and the hybrid folder, each with its graph."""
    import torch

    from byoc import onnx_graph
    from byoc.tasks.hybrid import COLBERT, SPARSE
    from byoc.training.model import bundled_model_dir

    shutil.rmtree(WORK, ignore_errors=True)
    dense, hybrid = WORK / "dense", WORK / "hybrid"
    for folder in (dense, hybrid):
        shutil.copytree(bundled_model_dir(), folder)
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(384, 384).state_dict(), hybrid / COLBERT)
    sparse = torch.nn.Linear(384, 1)
    sparse.bias.data += 0.3
    torch.save(sparse.state_dict(), hybrid / SPARSE)
    for folder in (dense, hybrid):
        assert onnx_graph.export(folder), folder
    return {"dense": dense, "hybrid": hybrid}


def reference_rate(folder: Path, hybrid: bool, texts: list[str], seconds: float) -> float:
    """Sentences/s of the reference's own encoding, 32 a call, in this process: BGEM3FlagModel's three outputs,
    or sentence-transformers' vectors."""
    if hybrid:
        from FlagEmbedding import BGEM3FlagModel

        model = BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu")

        def encode(batch: list[str]) -> object:
            outputs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
            # batch_size one over the call's texts: still one pass of 32, and no progress bars (shown from a batch up)
            return model.encode(batch, batch_size=BATCH + 1, **outputs)
    else:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")

        def encode(batch: list[str]) -> object:
            return st.encode(batch, batch_size=BATCH, convert_to_numpy=True)

    encode(texts[:BATCH])  # warm-up
    return rate(encode, texts, seconds, BATCH)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "hybrid.json")
    options = parser.parse_args()
    first, second, _ = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    results: dict = {"threads": os.cpu_count(), "batch": BATCH}
    built = folders()
    runs = [("dense", {}, "sentence_transformers"), ("hybrid", {"output": ALL}, "flagembedding")]
    for kind, parameters, reference in runs:
        model = load(built[kind], "fp32")
        ceiling(model, texts, 1.0, parameters)  # warm-up
        ours = ceiling(model, texts, options.seconds, parameters)
        theirs = reference_rate(built[kind], kind == "hybrid", texts, options.seconds)
        results[kind] = {"byoc": round(ours, 1), reference: round(theirs, 1)}
        if kind == "hybrid":
            results[kind]["byoc_dense_only"] = round(ceiling(model, texts, options.seconds), 1)
        print(f"{kind:8s} byoc {ours:7.1f} sentences/s, {reference} {theirs:7.1f} ({ours / theirs:.2f}x)", flush=True)
    hybrid = results["hybrid"]
    results["hybrid_over_dense"] = round(hybrid["byoc"] / results["dense"]["byoc"], 3)
    results["hybrid_over_flagembedding"] = round(hybrid["byoc"] / hybrid["flagembedding"], 3)
    print(
        f"hybrid (three outputs) / dense (byoc): {results['hybrid_over_dense']:.2f}x; "
        f"hybrid asked for its dense vectors alone: {hybrid['byoc_dense_only']:.1f} sentences/s",
        flush=True,
    )
    harness.write_results(options.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
