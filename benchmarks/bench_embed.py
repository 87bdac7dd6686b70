"""Serving an embedding model: `byoc serve` on all-MiniLM-L6-v2 as the Hub has it, after
`byoc export-onnx --int8` (pooling inside the graph), fp32 and int8.

Same machine, same run, 127.0.0.1 only; SICK's sentences (../shared/data/sick):
- throughput and latency of TEI-shaped requests (`{"inputs": ...}`): single sentences at concurrency 32,
  and 16 sentences a request at concurrency 8 (the issue's two shapes), each phase bounded in time;
- the model alone: the default predict_fn in this process, 32 sentences a call, no HTTP: the ceiling
  of any server on this machine with the same graph and threads;
- quality: int8's vectors against fp32's (mean cosine), and each precision's Spearman correlation
  between the cosine of SICK's test pairs and their human relatedness scores (an STS-B-like check),
  beside sentence-transformers' own encode.

    .venv/bin/python benchmarks/bench_embed.py [--seconds 10] [--warmup 3] [--rounds 1] [--json ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
from child_process import exit_on_sigterm  # noqa: E402


def quality(folder: Path) -> dict:
    from sentence_transformers import SentenceTransformer

    from byoc.tasks.regression import regression_metrics

    first, second, gold = fixtures.sick_pairs()
    result = {}
    reference = SentenceTransformer(str(folder), device="cpu")
    encoded = {"sentence-transformers": (reference.encode(first), reference.encode(second))}
    for precision in ("fp32", "int8"):
        model = fixtures.load(folder, precision)
        encoded[precision] = (fixtures.vectors(model, first), fixtures.vectors(model, second))
    fp32 = np.concatenate(encoded["fp32"])
    for name, (a, b) in encoded.items():
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        both = np.concatenate([a, b])
        to_fp32 = (both * fp32).sum(1) / np.linalg.norm(both, axis=1) / np.linalg.norm(fp32, axis=1)
        spearman = regression_metrics(cos, gold)["spearmanr"]  # ties (SICK's scores have many) share their rank
        result[name] = {"spearman_sick_test": spearman, "mean_cosine_to_fp32": float(to_fp32.mean())}
        print(
            f"{name:22s} SICK test Spearman {result[name]['spearman_sick_test']:.4f}, "
            f"mean cosine to byoc fp32 {result[name]['mean_cosine_to_fp32']:.5f}",
            flush=True,
        )
    return result


def served(folder: Path, precision: str, texts: list[str], opts: argparse.Namespace) -> dict:
    """One precision: the model alone (the ceiling), then byoc serve on it at the issue's two shapes."""
    result: dict = {"ceiling": fixtures.ceiling(fixtures.load(folder, precision), texts)}
    print(f"model alone, {precision}: {result['ceiling']:.1f} sentences/s", flush=True)
    port = servers.free_port()
    settings = {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": precision}
    proc, started = servers.start_byoc(folder, port, settings)
    try:
        reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        for per_request, concurrency in fixtures.SHAPES:
            r = servers.run_load(port, texts, per_request, concurrency, opts.warmup, opts.seconds)
            result[f"{per_request}x{concurrency}"] = r
            print(
                f"byoc {precision} {per_request:2d}/request, concurrency {concurrency:2d}: "
                f"{r['sentences_per_second']:7.1f} sentences/s p50 {r['p50_ms']:6.0f} ms p99 {r['p99_ms']:6.0f} ms"
                f"{'  errors ' + str(r['errors']) if r['errors'] else ''}",
                flush=True,
            )
        result["rss_mib"] = servers.rss_tree_mib(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers (a session of their own)
        proc.wait(60)
    return result


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    folder = fixtures.model_folder()
    first, second, _ = fixtures.sick_pairs()
    texts = list(dict.fromkeys(first + second))
    results: dict = {"quality": quality(folder), "rounds": opts.rounds}
    precisions = ("fp32", "int8")
    runs = harness.scenarios({p: lambda p=p: served(folder, p, texts, opts) for p in precisions}, opts.rounds)
    results["ceiling"] = {p: runs[p].pop("ceiling") for p in precisions}
    results["serve"] = {f"{p} {phase}": figures for p in precisions for phase, figures in runs[p].items()}
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
