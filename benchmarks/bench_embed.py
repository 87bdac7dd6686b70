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

    .venv/bin/python benchmarks/bench_embed.py [--seconds 10] [--warmup 3] [--json benchmarks/results/embed.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve  # noqa: E402  (the load generator and the server start)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import shared_data  # noqa: E402
from child_process import exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-embed")
SHAPES = ((1, 32), (16, 8))  # (sentences a request, concurrency)


def sick_pairs() -> tuple[list[str], list[str], np.ndarray]:
    rows = [
        line.split("\t") for line in (shared_data.folder("sick") / "SICK_test_annotated.txt").read_text().splitlines()
    ]
    rows = [r for r in rows[1:] if len(r) >= 4]
    return [r[1] for r in rows], [r[2] for r in rows], np.array([float(r[3]) for r in rows])


def model_folder() -> Path:
    """The Hub folder, copied, with model.onnx and model.int8.onnx written by byoc's own export."""
    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = WORK / "model"
    if not (target / onnx_graph.INT8_GRAPH).exists():
        shutil.rmtree(WORK, ignore_errors=True)
        shutil.copytree(bundled_model_dir(), target)
        assert onnx_graph.export(target) and onnx_graph.export_int8(target)
    return target


def vectors(model: dict, texts: list[str]) -> np.ndarray:
    from byoc.serving import default_pipeline

    out = []
    for i in range(0, len(texts), 64):
        out.extend(default_pipeline.predict_fn({"inputs": texts[i : i + 64], "parameters": {}}, model))
    return np.asarray(out, dtype=np.float64)


def load(folder: Path, precision: str, backend: str = "onnxruntime") -> dict:
    from byoc.serving import default_pipeline
    from byoc.serving.settings import InferenceSettings

    settings = InferenceSettings(backend=backend, precision=precision, threads=os.cpu_count() or 1)
    with default_pipeline.serving_with(settings):
        return default_pipeline.model_fn(str(folder))


def rate(encode: Callable[[list[str]], object], texts: list[str], seconds: float, batch: int = 32) -> float:
    """Sentences/s of `encode`, `batch` texts a call (SICK's in turn), for `seconds`, in this process."""
    done, started, i = 0, time.monotonic(), 0
    while time.monotonic() - started < seconds:
        chunk = texts[i : i + batch] or texts[:batch]
        encode(chunk)
        done, i = done + len(chunk), (i + batch) % len(texts)
    return done / (time.monotonic() - started)


def ceiling(model: dict, texts: list[str], seconds: float = 6.0, parameters: dict | None = None) -> float:
    """Sentences/s of the default predict_fn, 32 a call, in this process (`parameters`: the request's)."""
    from byoc.serving import default_pipeline

    def answer(batch: list[str]) -> object:
        return default_pipeline.predict_fn({"inputs": batch, "parameters": parameters or {}}, model)

    return rate(answer, texts, seconds)


def quality(folder: Path) -> dict:
    from sentence_transformers import SentenceTransformer

    from byoc.tasks.regression import regression_metrics

    first, second, gold = sick_pairs()
    result = {}
    reference = SentenceTransformer(str(folder), device="cpu")
    encoded = {"sentence-transformers": (reference.encode(first), reference.encode(second))}
    for precision in ("fp32", "int8"):
        model = load(folder, precision)
        encoded[precision] = (vectors(model, first), vectors(model, second))
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


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    folder = model_folder()
    first, second, _ = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    results: dict = {"quality": quality(folder), "serve": {}, "ceiling": {}}
    for precision in ("fp32", "int8"):
        results["ceiling"][precision] = ceiling(load(folder, precision), texts)
        print(f"model alone, {precision}: {results['ceiling'][precision]:.1f} sentences/s", flush=True)
        port = bench_serve.free_port()
        settings = {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": precision}
        proc, started = bench_serve.start_byoc(folder, port, settings)
        try:
            bench_serve.reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
            for per_request, concurrency in SHAPES:
                r = bench_serve.run_load(port, texts, per_request, concurrency, opts.warmup, opts.seconds)
                results["serve"][f"{precision} {per_request}x{concurrency}"] = r
                print(
                    f"byoc {precision} {per_request:2d}/request, concurrency {concurrency:2d}: "
                    f"{r['sentences_per_second']:7.1f} sentences/s p50 {r['p50_ms']:6.0f} ms p99 {r['p99_ms']:6.0f} ms"
                    f"{'  errors ' + str(r['errors']) if r['errors'] else ''}",
                    flush=True,
                )
            results["serve"][f"{precision} rss_mib"] = bench_serve.rss_tree_mib(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers (a session of their own)
            proc.wait(60)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
