"""Cached in-batch negatives (`mini_batch_size`) against the plain loss (make bench-cached-loss): training steps
of byoc's embedding model (the bundled all-MiniLM-L6-v2, SICK train's ENTAILMENT pairs as (anchor, positive)
rows, texts cut at 64 tokens), each configuration in a process of its own so that its peak memory is its own.

  plain/N     MultipleNegativesRankingLoss at batch N (every row's activations held for the backward pass)
  cached/N    CachedMultipleNegativesRankingLoss at batch N, 32 rows a pass (one extra forward pass a step)
  cached/N/M  the same, M rows a pass

Each: one warm-up step, then `--steps` timed steps (forward, backward, AdamW), samples/s and the process's
peak resident memory (on a GPU also the peak GPU memory; a batch that does not fit is reported, not fatal).
`--model bert-base` swaps in a randomly initialised BERT-base-shaped encoder (speed and memory only: the
issue's second size); on cuda the step runs in TF32, as `precision=auto` trains there.

    .venv/bin/python benchmarks/bench_cached_loss.py [--configs plain/64,plain/256,cached/256,cached/1024]
    python3 benchmarks/bench_cached_loss.py --device cuda --model bert-base --steps 6 \
        --configs plain/1024,cached/1024/256 --json results/cached_loss-h100-bert-base.json   (on a GPU)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
MINI_BATCH = 32


def bert_base_folder(into: Path) -> Path:
    """A randomly initialised BERT-base-shaped encoder with the bundled model's tokenizer (a plain encoder
    folder: byoc adds mean pooling, as for any Hub encoder)."""
    import shutil

    from transformers import BertConfig, BertModel

    from byoc.training.model import bundled_model_dir

    bundled = bundled_model_dir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(bundled / name, into / name)
    BertModel(BertConfig(vocab_size=30522)).save_pretrained(into)  # BertConfig's defaults are BERT-base's
    return into


def one(config: str, steps: int, device: str, model_name: str) -> dict:
    """Run one configuration here; its figures."""
    import torch
    from fixtures import sick  # benchmarks/, beside this script

    from byoc.tasks.embedding import model as embedding
    from byoc.training.model import bundled_model_dir

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True  # as precision=auto on cuda; no effect on a CPU
    kind, size, *mini = config.split("/")
    batch_size = int(size)
    with tempfile.TemporaryDirectory() as scratch:
        path = bert_base_folder(Path(scratch)) if model_name == "bert-base" else bundled_model_dir()
        model = embedding.build(str(path), False, 64, model_kwargs={}, config_kwargs={})
    if kind == "cached":
        embedding.cache_negatives(model, int(mini[0]) if mini else MINI_BATCH)
    model.to(device).train()
    rows = [r for r in sick("SICK_train.txt") if r["entailment_judgment"] == "ENTAILMENT"]
    tokenizer = model.model.tokenizer
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)

    def batch(step: int) -> dict:
        chosen = [rows[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        out = {}
        for prefix, column in (("", "sentence_A"), ("pair_", "sentence_B")):
            encoded = tokenizer([r[column] for r in chosen], padding=True, truncation=True, max_length=64)
            out.update({prefix + key: torch.tensor(value, device=device) for key, value in encoded.items()})
        return out

    def step(number: int) -> None:
        loss = model(**batch(number), labels=torch.full((batch_size,), float("nan"), device=device))["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    try:
        step(0)
        synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        synchronize()
        start = time.perf_counter()
        for number in range(1, steps + 1):
            step(number)
        synchronize()
    except torch.cuda.OutOfMemoryError:
        return {"out_of_memory": True}
    seconds = time.perf_counter() - start
    peak_mib = harness.peak_rss_mib()
    figures = {"samples_per_second": round(batch_size * steps / seconds, 1), "peak_rss_mib": round(peak_mib)}
    if device.startswith("cuda"):
        figures["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="plain/64,plain/256,cached/256,cached/1024")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--model", choices=["minilm", "bert-base"], default="minilm")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    harness.add_rounds(parser)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "cached_loss.json")
    options = parser.parse_args()
    if options.one:
        print(json.dumps(one(options.one, options.steps, options.device, options.model)))
        return 0
    results = {"mini_batch_size": MINI_BATCH, "steps": options.steps, "device": options.device, "model": options.model}
    results["rounds"] = options.rounds

    def measured(config: str) -> dict:
        child = ["--one", config, "--steps", str(options.steps), "--device", options.device, "--model", options.model]
        done = subprocess.run(
            [sys.executable, __file__, *child],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        )
        if done.returncode:
            raise SystemExit(f"{config} failed:\n{done.stderr[-3000:]}")
        figures = results[config] = json.loads(done.stdout.strip().splitlines()[-1])
        # Written after each configuration: a run stopped at a time limit keeps what it measured.
        harness.write_results(options.json, results)
        if figures.get("out_of_memory"):
            print(f"{config:14s} does not fit", flush=True)
        else:
            rate, peak = figures["samples_per_second"], figures["peak_rss_mib"]
            gpu = f"  GPU peak {figures['peak_gpu_mib']} MiB" if "peak_gpu_mib" in figures else ""
            print(f"{config:14s} {rate:8.1f} samples/s  peak {peak} MiB{gpu}", flush=True)
        return figures

    declared = {config: lambda config=config: measured(config) for config in options.configs.split(",")}
    results.update(harness.scenarios(declared, options.rounds))
    harness.write_results(options.json, results)
    print(f"written to {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
