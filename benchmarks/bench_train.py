"""Training speed: byoc's recipe against the tutorials' recipe and a plain dynamic-padding Trainer.

Same machine, same run, same data (emotion train split), same model (all-MiniLM-L6-v2), same batch
size (16) and learning rate (5e-5); the recipes are run alternately, each in a fresh process, for
`--rounds` rounds, and each run is timed over `--steps` optimizer steps after `--warmup` steps.

  tutorial  HF Trainer, padding="max_length", max_length=128 (the public tutorials' recipe)
  dynamic   HF Trainer, dynamic padding + length-grouped batches
  byoc      byoc's trainer with its defaults (frozen embeddings, dropout 0, dynamic padding,
            length buckets), built by the same functions `byoc train` uses; `byoc:key=value:...`
            adds hyperparameters (e.g. `byoc:freeze_layers=1`); `byoc:task=multi_label`,
            `byoc:task=regression` and `byoc:task=ner` train the same texts as a multi-label task (each
            label a one-hot list), a regression (the label id as a number) or NER (the words, every third
            tagged): the same lengths, another head and loss; `byoc:task=embedding` pairs the texts up
            (text 2i the anchor, text 2i+1 its positive: in-batch negatives), each row two texts, so
            its samples are texts (a row counts twice) and the comparison is per text encoded

Reports samples/s (median over rounds), tokens fed per sample (those the encoder computed, where it packs:
`byoc:group_by_length=false` against `...:packing=false`), the ratio to each baseline and the achieved fp32
GFLOP/s (6 x non-embedding parameters x tokens fed). Run it alone: a second busy
process on these 2 cores slows every run several-fold.

    .venv/bin/python benchmarks/bench_train.py [--rounds 2] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)
import shared_data  # benchmarks/, beside this script
from child_process import dies_with_parent, exit_on_sigterm

REPO = Path(__file__).resolve().parents[1]
DATA = shared_data.find("emotion")
RECIPES = ("tutorial", "dynamic", "byoc")
BATCH, LR = 16, 5e-5


def load_rows(limit: int) -> tuple[list[str], list[int], list[str]]:
    lines = (DATA / "train.txt").read_text(encoding="utf-8").split("\n")[1:]
    rows = [line.rsplit(";", 1) for line in lines if line.strip()][:limit]
    names = sorted({label for _, label in rows})
    return [t for t, _ in rows], [names.index(label) for _, label in rows], names


def run_one(recipe: str, steps: int, warmup: int) -> dict:
    """One timed run in this process."""
    import datasets
    import torch
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    from byoc.training.model import bundled_model_dir

    model_dir = str(bundled_model_dir())
    total = steps + warmup
    per_row = 2 if "task=embedding" in recipe else 1  # texts a training row holds
    texts, labels, names = load_rows(per_row * (max(total * BATCH, 50 * BATCH) + 1000))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    raw = datasets.Dataset.from_dict({"text": texts, "label": labels})

    class Clock(TrainerCallback):
        marks: dict[int, float] = {}

        def on_step_end(self, args, state, control, **kwargs):
            Clock.marks[state.global_step] = time.perf_counter()

    tokens = {"fed": 0, "samples": 0}

    def counting(collator):
        def collate(features):
            batch = collator(features)
            if tokens["samples"] < total * BATCH * per_row:
                for key in ("input_ids", "pair_input_ids"):  # an embedding model's rows hold two texts
                    if key in batch:
                        tokens["fed"] += batch[key].numel()
                        tokens["samples"] += batch[key].shape[0]
            return batch

        return collate

    common = dict(
        output_dir="/tmp/byoc-bench",
        max_steps=total,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        seed=42,
        report_to="none",
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        dataloader_pin_memory=False,
    )
    if recipe.startswith("byoc"):
        from byoc.contract import Paths, TrainingContract
        from byoc.training.data import TaskData
        from byoc.training.hyperparameters import given_names, parse_hyperparameters
        from byoc.training.model import ModelSource, load_model
        from byoc.training.tokenization import tokenize_splits
        from byoc.training.trainer import build_trainer

        given = {
            "max_steps": str(total),
            "per_device_train_batch_size": str(BATCH),
            "learning_rate": str(LR),
            "logging_steps": "1000000",
            "eval_strategy": "no",
            **dict(kv.split("=", 1) for kv in recipe.split(":")[1:]),
        }
        args = parse_hyperparameters(given)
        cache = Path("/tmp/byoc-bench/cache")
        if args.task == "multi_label_classification":
            raw = raw.cast_column("label", datasets.Value("float32")).map(
                lambda row: {"label": [float(row["label"] == i) for i in range(len(names))]},
                features=datasets.Features(
                    {"text": datasets.Value("string"), "label": datasets.Sequence(datasets.Value("float32"))}
                ),
            )
        elif args.task == "regression":
            raw = raw.cast_column("label", datasets.Value("float32"))
            names = ["label"]
        elif args.task == "embedding":
            half = len(texts) // 2
            raw = datasets.Dataset.from_dict(
                {"text": texts[0 : 2 * half : 2], "text_pair": texts[1 : 2 * half : 2], "label": [float("nan")] * half}
            )
            names = []
        elif args.task == "token_classification":  # the same texts as words, every third word an entity
            names = ["O", "B-X", "I-X"]
            raw = datasets.Dataset.from_dict(
                {
                    "tokens": [t.split() for t in texts],
                    "tags": [[1 if i % 3 == 0 else 0 for i in range(len(t.split()))] for t in texts],
                }
            )
        task = args.task if args.task != "auto" else "single_label_classification"
        # The task's own defaults, as a job gets them.
        args = args.for_task(task, len(raw), given_names(given), len(names))
        data = TaskData(train=raw, eval=None, test=None, label_names=names, pretokenized=False, task=task)
        tokenized = tokenize_splits(data, tokenizer, args, cache)
        model = load_model(ModelSource(model_dir, "bundled"), args, names, task=task)
        contract = TrainingContract(paths=Paths(Path("/tmp/byoc-bench/opt-ml")), hyperparameters={}, channels={})
        trainer = build_trainer(model, tokenizer, tokenized, args, contract, names, task=task)
        trainer.data_collator = counting(trainer.data_collator)
    else:
        padding = {"tutorial": "max_length", "dynamic": False}[recipe]
        encoded = raw.map(
            lambda b: tokenizer(b["text"], truncation=True, max_length=128, padding=padding),
            batched=True,
            remove_columns=["text"],
        )
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(names))
        targs = TrainingArguments(
            **common, train_sampling_strategy="group_by_length" if recipe == "dynamic" else "random"
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=encoded,
            processing_class=tokenizer,
            data_collator=counting(DataCollatorWithPadding(tokenizer)),
        )
    trainer.add_callback(Clock())
    trainer.train()
    seconds = Clock.marks[total] - Clock.marks[warmup]
    non_embedding = sum(p.numel() for n, p in trainer.model.named_parameters() if "embeddings" not in n)
    per_sample = tokens["fed"] / max(tokens["samples"], 1)
    if recipe.startswith("byoc"):  # a packed job's encoder computed only part of the padded batches' tokens
        from byoc.training import packing

        per_sample *= packing.summary(trainer).get("packed_token_share", 1.0)
    rate = steps * BATCH * per_row / seconds
    return {
        "recipe": recipe,
        "samples_per_second": rate,
        "tokens_per_sample": per_sample,
        "gflops": 6 * non_embedding * per_sample * rate / 1e9,
        "threads": torch.get_num_threads(),
    }


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps before the clock starts")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    if DATA is None:
        sys.exit(shared_data.missing("emotion"))
    if opts.one:
        print("RESULT " + json.dumps(run_one(opts.one, opts.steps, opts.warmup)))
        return 0

    def scenario(recipe: str) -> Callable[[], dict]:
        def run() -> dict:  # (a process of its own: each recipe's imports, threads and memory alike)
            out = subprocess.run(
                [sys.executable, __file__, "--one", recipe, "--steps", str(opts.steps), "--warmup", str(opts.warmup)],
                capture_output=True,
                text=True,
                preexec_fn=dies_with_parent,
            )
            line = [row for row in out.stdout.splitlines() if row.startswith("RESULT ")]
            if out.returncode or not line:
                raise RuntimeError(f"{recipe} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
            result = json.loads(line[0][7:])
            print(
                f"{recipe:9s} {result['samples_per_second']:7.1f} samples/s  "
                f"{result['tokens_per_sample']:6.1f} tokens/sample  {result['gflops']:6.1f} GFLOP/s",
                flush=True,
            )
            return result

        return run

    # Alternated (harness.alternate), so drifting machine load hits every recipe alike.
    results = harness.alternate({r: scenario(r) for r in opts.recipes.split(",")}, opts.rounds)
    summary = {
        r: {k: statistics.median(x[k] for x in runs) for k in ("samples_per_second", "tokens_per_sample", "gflops")}
        for r, runs in results.items()
    }
    # Speed-ups are paired within a round (this machine's speed drifts between rounds), then the median.
    ours = results.get("byoc")
    for recipe, runs in results.items():
        if ours:
            summary[recipe]["byoc_speedup"] = statistics.median(
                o["samples_per_second"] / r["samples_per_second"] for o, r in zip(ours, runs)
            )
    print(
        f"\n| recipe | tokens fed / sample | train samples/s (median of {opts.rounds}) | fp32 GFLOP/s "
        "| byoc speed-up (paired median) |"
    )
    print("|---|---|---|---|---|")
    for recipe, s in summary.items():
        ratio = f"{s['byoc_speedup']:.2f}x" if "byoc_speedup" in s else "-"
        print(
            f"| {recipe} | {s['tokens_per_sample']:.1f} | {s['samples_per_second']:.1f} | {s['gflops']:.0f} | {ratio} |"
        )
    if opts.json:
        harness.write_results(opts.json, {"summary": summary, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
