"""Cached in-batch negatives (`mini_batch_size`) against the plain loss (make bench-cached-loss): training steps
of byoc's embedding model (the bundled all-MiniLM-L6-v2, SICK train's ENTAILMENT pairs as (anchor, positive)
rows, texts cut at 64 tokens), each configuration in a process of its own so that its peak memory is its own.

  plain/N     MultipleNegativesRankingLoss at batch N (every row's activations held for the backward pass)
  cached/N    CachedMultipleNegativesRankingLoss at batch N, 32 rows a pass (one extra forward pass a step)

Each: one warm-up step, then `--steps` timed steps (forward, backward, AdamW), samples/s and the process's
peak resident memory.

    .venv/bin/python benchmarks/bench_cached_loss.py [--configs plain/64,plain/256,cached/256,cached/1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
MINI_BATCH = 32


def one(config: str, steps: int) -> dict:
    """Run one configuration here; its figures."""
    import torch
    from bench_embed_train import sick  # benchmarks/, beside this script

    from byoc.tasks.embedding import model as embedding
    from byoc.training.model import bundled_model_dir

    torch.manual_seed(0)
    kind, size = config.split("/")
    batch_size = int(size)
    model = embedding.build(str(bundled_model_dir()), False, 64, model_kwargs={}, config_kwargs={})
    if kind == "cached":
        embedding.cache_negatives(model, MINI_BATCH)
    model.train()
    rows = [r for r in sick("SICK_train.txt") if r["entailment_judgment"] == "ENTAILMENT"]
    tokenizer = model.model.tokenizer
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)

    def batch(step: int) -> dict:
        chosen = [rows[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        out = {}
        for prefix, column in (("", "sentence_A"), ("pair_", "sentence_B")):
            encoded = tokenizer([r[column] for r in chosen], padding=True, truncation=True, max_length=64)
            out.update({prefix + key: torch.tensor(value) for key, value in encoded.items()})
        return out

    def step(number: int) -> None:
        loss = model(**batch(number), labels=torch.full((batch_size,), float("nan")))["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step(0)
    start = time.perf_counter()
    for number in range(1, steps + 1):
        step(number)
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"samples_per_second": round(batch_size * steps / seconds, 1), "peak_rss_mib": round(peak_mib)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="plain/64,plain/256,cached/256,cached/1024")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "cached_loss.json")
    options = parser.parse_args()
    if options.one:
        print(json.dumps(one(options.one, options.steps)))
        return 0
    results = {"mini_batch_size": MINI_BATCH, "steps": options.steps}
    for config in options.configs.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--one", config, "--steps", str(options.steps)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        )
        if done.returncode:
            raise SystemExit(f"{config} failed:\n{done.stderr[-3000:]}")
        results[config] = json.loads(done.stdout.strip().splitlines()[-1])
        figures = results[config]
        rate, peak = figures["samples_per_second"], figures["peak_rss_mib"]
        print(f"{config:12s} {rate:8.1f} samples/s  peak {peak} MiB", flush=True)
    options.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
