"""The XLA (Trainium) path on torch-xla's CPU backend: compiled graphs, padding, throughput.

Runs real `byoc train` jobs with device=xla (PJRT_DEVICE=CPU) on the emotion data with
all-MiniLM-L6-v2, in this venv (the XLA tier's: `make bench-xla` uses .venv-xla), one after the
other, for two recipes on the same backend, data, batch size and epochs:

  byoc      fixed-shape buckets chosen from the data (buckets=auto, 5 sizes)
  tutorial  every text padded to 128 tokens (buckets=128): the tutorials' one-shape recipe

and reports, from torch-xla's own metrics (the `UncachedCompile` counter, per epoch and per
evaluation, as each job writes them to metrics.json), the graphs each job compiled; padding
efficiency (real tokens / padded tokens) on the whole emotion train split for byoc's buckets and
for the 128- and 512-token recipes; and steady-state training samples/s (epoch 2, after every
graph is compiled, from the jobs' progress lines), with byoc's ratio to the tutorial recipe.
Run it alone: a second busy process on these 2 cores slows every run several-fold.

    .venv-xla/bin/python benchmarks/bench_xla.py [--rows 384] [--epochs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)
import shared_data  # benchmarks/, beside this script
from child_process import byoc_train, exit_on_sigterm

REPO = Path(__file__).resolve().parents[1]
DATA = shared_data.find("emotion")
WORK = Path("/tmp/byoc-bench-xla")
RECIPES = {"byoc": "auto", "tutorial": "128"}
PROGRESS = re.compile(r"\[metrics\] step=(\d+) epoch=([\d.]+) loss=\S+ .*samples_per_second=([\d.]+)")


def padding_report() -> dict[str, float]:
    """Padding efficiency on the whole emotion train split, with the tokenizer byoc trains with."""
    from transformers import AutoTokenizer

    from byoc.training.buckets import choose_buckets, padding_efficiency
    from byoc.training.model import bundled_model_dir

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    texts = [
        line.rsplit(";", 1)[0]
        for line in (DATA / "train.txt").read_text(encoding="utf-8").split("\n")[1:]
        if line.strip()
    ]
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=256)["input_ids"]]
    buckets = choose_buckets(lengths, max_buckets=5, max_length=256)
    return {
        "buckets": buckets,
        "byoc": padding_efficiency(lengths, buckets),
        "tutorial_128": padding_efficiency(lengths, [128]),
        "tutorial_512": padding_efficiency(lengths, [512]),
        "mean_tokens": sum(lengths) / len(lengths),
    }


def run_job(name: str, buckets: str, rows: int, epochs: int) -> dict:
    root = WORK / name / "opt-ml"
    shutil.rmtree(root.parent, ignore_errors=True)
    for channel, source, count in (("train", "train.txt", rows), ("test", "test.txt", rows // 2)):
        lines = (DATA / source).read_text(encoding="utf-8").split("\n")
        (root / "input" / "data" / channel).mkdir(parents=True)
        (root / "input" / "data" / channel / source).write_text("\n".join(lines[: count + 1]) + "\n", encoding="utf-8")
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps(
            {
                "device": "xla",
                "buckets": buckets,
                "epochs": str(epochs),
                "per_device_train_batch_size": "16",
                "per_device_eval_batch_size": "32",
                "learning_rate": "5e-5",
                "eval_strategy": "epoch",
                "logging_steps": "4",
            }
        )
    )
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(WORK / "cache"), "PJRT_DEVICE": "CPU"}
    started = time.monotonic()
    done = byoc_train(env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{name}: byoc train failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    metrics = json.loads((root / "output" / "data" / "metrics.json").read_text())
    progress = [(int(s), float(e), float(r)) for s, e, r in PROGRESS.findall(done.stdout)]
    # epoch 2 after its first progress line (which still includes epoch 1's evaluation): compiled, steady
    steady = [rate for _, epoch, rate in progress if epoch > 1.0][1:]
    return {
        "buckets": metrics["buckets"],
        "graphs": metrics["xla_graphs_compiled"],
        "graphs_per_epoch": metrics["xla_graphs_per_epoch"],
        "graphs_per_evaluation": metrics["xla_graphs_per_evaluation"],
        "compile_seconds": metrics["xla_compile_seconds"],
        "padding_efficiency": metrics["padding_efficiency"],
        "steady_samples_per_second": sum(steady) / len(steady) if steady else float("nan"),
        "eval_accuracy": metrics.get("eval_accuracy"),
        "wall_seconds": time.monotonic() - started,
    }


def job(name: str, buckets: str, opts: argparse.Namespace) -> dict:
    r = run_job(name, buckets, opts.rows, opts.epochs)
    print(
        f"{name:8s} buckets {r['buckets']}: {r['graphs']} graphs compiled (per epoch {r['graphs_per_epoch']}, "
        f"per evaluation {r['graphs_per_evaluation']}; {r['compile_seconds']:.0f} s compiling), steady "
        f"{r['steady_samples_per_second']:.1f} samples/s, eval accuracy {r['eval_accuracy']:.3f}, "
        f"{r['wall_seconds']:.0f} s in all",
        flush=True,
    )
    return r


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=384, help="training rows (the test channel gets half)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if DATA is None:
        sys.exit(shared_data.missing("emotion"))
    results: dict = {"padding": padding_report()}
    pad = results["padding"]
    print(
        f"padding efficiency on emotion train ({pad['mean_tokens']:.1f} tokens per text): byoc buckets "
        f"{pad['buckets']} {pad['byoc']:.3f}; 128-token recipe {pad['tutorial_128']:.3f}; 512-token recipe "
        f"{pad['tutorial_512']:.3f}",
        flush=True,
    )
    declared = {name: lambda n=name, b=buckets: job(n, b, opts) for name, buckets in RECIPES.items()}
    results.update(harness.scenarios(declared, opts.rounds))
    results["rounds"] = opts.rounds
    ratio = results["byoc"]["steady_samples_per_second"] / results["tutorial"]["steady_samples_per_second"]
    results["speedup"] = ratio
    print(f"byoc / tutorial steady training samples/s on XLA CPU: {ratio:.2f}x")
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
