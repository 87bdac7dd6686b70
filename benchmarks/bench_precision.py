"""What int8 serving costs in accuracy and gains in speed, against fp32, on the emotion test split.

Runs the default handlers (`byoc.serving.default_pipeline`) in this process on each runtime: ONNX Runtime fp32
(the default), ONNX Runtime int8 (BYOC_INFERENCE_PRECISION=int8) and torch; for each, accuracy on
the 2000 test tweets, how often it picks the label fp32 picks (and how far that label's score
moves), and sentences/s of `predict_fn` over all of them (no HTTP). The model is one
trained by `byoc train` for an epoch on the emotion train split (trained on first use, ~5 min here).
Run it alone.

    .venv/bin/python benchmarks/bench_precision.py [--model DIR] [--rounds 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)
import shared_data  # benchmarks/, beside this script
from child_process import byoc_train, exit_on_sigterm

from byoc.serving import default_pipeline

REPO = Path(__file__).resolve().parents[1]
DATA = shared_data.find("emotion")
WORK = Path("/tmp/byoc-bench-precision")


def trained_model() -> Path:
    root = WORK / "opt-ml"
    if (root / "model" / "model.onnx").exists():
        return root / "model"
    (root / "input" / "data" / "train").mkdir(parents=True, exist_ok=True)
    (root / "input" / "data" / "train" / "train.txt").write_bytes((DATA / "train.txt").read_bytes())
    (root / "input" / "config").mkdir(parents=True, exist_ok=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps({"epochs": "1"}))
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(WORK / "cache")}
    byoc_train(env, check=True, stdout=subprocess.DEVNULL)
    return root / "model"


def measure(model_dir: Path, settings: dict[str, str], texts: list[str], labels: list[str]) -> dict:
    os.environ.update(settings)  # model_fn reads the backend and precision variables when called
    try:
        started = time.perf_counter()
        model = default_pipeline.model_fn(str(model_dir))
        load_s = time.perf_counter() - started
        default_pipeline.predict_fn({"inputs": texts[:64]}, model)  # warm-up
        started = time.perf_counter()
        answers = [
            a
            for i in range(0, len(texts), 32)
            for a in default_pipeline.predict_fn({"inputs": texts[i : i + 32]}, model)
        ]
        seconds = time.perf_counter() - started
    finally:
        for key in settings:
            os.environ.pop(key)
    accuracy = sum(a["label"] == y for a, y in zip(answers, labels)) / len(labels)
    return {"accuracy": accuracy, "sentences_per_second": len(texts) / seconds, "load_s": load_s, "answers": answers}


def agreement(answers: list[dict], exact: list[dict]) -> dict:
    """How often a runtime picks fp32's label, and how far its score for that label moves."""
    same = sum(a["label"] == e["label"] for a, e in zip(answers, exact)) / len(exact)
    moved = [abs(a["score"] - e["score"]) for a, e in zip(answers, exact) if a["label"] == e["label"]]
    return {"agreement_with_fp32": same, "max_score_change": max(moved, default=0.0)}


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder from byoc train (default: train one)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if DATA is None:
        sys.exit(shared_data.missing("emotion"))
    lines = (DATA / "test.txt").read_text(encoding="utf-8").split("\n")[1:]
    rows = [line.rsplit(";", 1) for line in lines if line.strip()]
    texts, labels = [r[0] for r in rows], [r[1].strip() for r in rows]
    model_dir = opts.model or trained_model()
    runtimes = {
        "onnxruntime fp32 (default)": {},
        "onnxruntime int8": {"BYOC_INFERENCE_PRECISION": "int8"},
        "torch fp32": {"BYOC_INFERENCE_BACKEND": "torch"},
    }
    declared = {name: lambda s=settings: measure(model_dir, s, texts, labels) for name, settings in runtimes.items()}
    results = harness.scenarios(declared, opts.rounds)
    exact = results["onnxruntime fp32 (default)"]["answers"]  # ONNX Runtime fp32 is the yardstick
    for name, r in results.items():
        r.update(agreement(r.pop("answers"), exact))
        print(
            f"{name:28s} accuracy {r['accuracy']:.4f}  {r['sentences_per_second']:6.0f} sentences/s  "
            f"model_fn {r['load_s']:.1f} s  same label as fp32 {r['agreement_with_fp32']:.2%} "
            f"(score moves up to {r['max_score_change']:.3f})",
            flush=True,
        )
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
