"""Serving a sparse (SPLADE) model against a dense one on the same encoder (make bench-sparse): the model alone
(byoc's default predict_fn in this process, 32 sentences a call, no HTTP), fp32 on ONNX Runtime, against
sentence-transformers' own `encode` in the same process at batch 32.

  dense    the bundled all-MiniLM-L6-v2 (mean pooling), its graph written by `byoc export-onnx`
  sparse   the same encoder under a masked-language-model head (BertForMaskedLM: the output projection is
           the word embeddings, tied; the head's transform drawn at random: speed only) and SPLADE's max
           pooling of log(1 + ReLU), saved by sentence-transformers as a SparseEncoder, its graph by byoc.
           The head's bias is lowered until a text has about ACTIVE terms, as a trained SPLADE model's
           have (a random head leaves most of the 30,522 active, and every answer would list them all)

Each phase runs `--seconds` on SICK's sentences, one after another on the same machine; the ratios are the
figures to read (these machines are noisy).

    .venv/bin/python benchmarks/bench_sparse.py [--seconds 8] [--json benchmarks/results/sparse.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from bench_embed import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's model-alone loop)
from child_process import exit_on_sigterm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
WORK = Path("/tmp/byoc-bench-sparse")
BATCH = 32
ACTIVE = 150  # terms a text: a trained SPLADE document's order of magnitude


def folders() -> dict[str, Path]:
    """The dense and the sparse folder, each with its graph."""
    import torch
    from transformers import BertForMaskedLM

    from byoc import compat, onnx_graph
    from byoc.training.model import bundled_model_dir

    shutil.rmtree(WORK, ignore_errors=True)
    dense, mlm, sparse = WORK / "dense", WORK / "mlm", WORK / "sparse"
    shutil.copytree(bundled_model_dir(), dense)
    torch.manual_seed(0)
    head = BertForMaskedLM.from_pretrained(str(bundled_model_dir()))
    sparsify(head, dense)
    head.save_pretrained(mlm)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (dense / name).exists():
            shutil.copy(dense / name, mlm / name)
    SparseEncoder, MLMTransformer, SpladePooling, _ = compat.sparse_encoder_api()
    encoder = SparseEncoder(modules=[MLMTransformer(str(mlm), max_seq_length=256), SpladePooling("max")], device="cpu")
    encoder.save(str(sparse))
    for folder in (dense, sparse):
        assert onnx_graph.export(folder), folder
    return {"dense": dense, "sparse": sparse}


def sparsify(head: Any, tokenizer_dir: Path) -> None:
    """Lower the head's output bias until SICK's texts have about ACTIVE terms each after SPLADE's pooling."""
    import torch
    from transformers import AutoTokenizer

    texts = list(dict.fromkeys(sick_pairs()[0]))[:256]
    encoded = AutoTokenizer.from_pretrained(str(tokenizer_dir))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = head(**encoded).logits.masked_fill(~encoded["attention_mask"].bool()[..., None], -1e4)
        pooled = logits.max(dim=1).values  # a text's highest logit for each term
        cut = pooled.topk(ACTIVE, dim=1).values[:, -1].mean()
        head.cls.predictions.bias -= cut


def reference_rate(folder: Path, sparse: bool, texts: list[str], seconds: float) -> float:
    """Sentences/s of sentence-transformers' own encode, 32 a call, in this process."""
    from byoc import compat

    model_class = compat.sparse_encoder_api()[0] if sparse else compat.sentence_transformers_api()[0]
    model = model_class(str(folder), device="cpu")
    model.encode(texts[:BATCH], batch_size=BATCH)  # warm-up
    return rate(lambda batch: model.encode(batch, batch_size=BATCH), texts, seconds, BATCH)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "sparse.json")
    options = parser.parse_args()
    first, second, _ = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    results: dict = {"threads": os.cpu_count(), "batch": BATCH, "active_terms_target": ACTIVE}
    for kind, folder in folders().items():
        model = load(folder, "fp32")
        ceiling(model, texts, seconds=1.0)  # warm-up
        byoc_rate = ceiling(model, texts, seconds=options.seconds)
        theirs = reference_rate(folder, kind == "sparse", texts, options.seconds)
        results[kind] = {"byoc": round(byoc_rate, 1), "sentence_transformers": round(theirs, 1)}
        print(
            f"{kind:6s} byoc {byoc_rate:7.1f} sentences/s, sentence-transformers {theirs:7.1f} "
            f"({byoc_rate / theirs:.2f}x)",
            flush=True,
        )
    results["sparse_over_dense"] = round(results["sparse"]["byoc"] / results["dense"]["byoc"], 3)
    results["sparse_over_sentence_transformers"] = round(
        results["sparse"]["byoc"] / results["sparse"]["sentence_transformers"], 3
    )
    print(f"sparse / dense (byoc): {results['sparse_over_dense']:.2f}x", flush=True)
    harness.write_results(options.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
