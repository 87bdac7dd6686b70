"""Test scores of every task byoc trains: `byoc train` with its defaults (only `epochs` given) against
a plain Hugging Face Trainer (learning rate 5e-5, batch 16, the same model and epochs).

Both read the same splits (byoc's own data loading, so both see identical rows and labels), fine-tune
the bundled all-MiniLM-L6-v2 on the CPU, and are scored by the same metric code on the same split.

  multi-label   semeval2018-ec   11 emotions per tweet (0/1 columns); scored on dev (no labelled test)
  regression    sick             relatedness 1-5 of a sentence pair; scored on the test split
  entailment    sick             3-class entailment of a pair; scored on the test split
  rte           rte              2-class entailment of a pair; scored on dev (test is unlabelled)
  emotion       emotion          6 emotions, one per tweet; scored on the test split
  ner           wnut17           named entities (6 types, IOB tags, CoNLL); entity F1 on the test split

Each run is a fresh process, byoc's a real `byoc train` job on a temporary /opt/ml tree.

    .venv/bin/python benchmarks/bench_tasks.py [--tasks multi-label,regression] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import shared_data  # benchmarks/, beside this script

REPO = Path(__file__).resolve().parents[1]
BATCH, LR = 16, 5e-5


# task -> (dataset, train file, test file, hyperparameters both need to read the data, headline metric)
TASKS = {
    "multi-label": ("semeval2018-ec", "2018-E-c-En-train.txt", "2018-E-c-En-dev.txt", {}, "f1_micro"),
    "regression": (
        "sick",
        "SICK_train.txt",
        "SICK_test_annotated.txt",
        {"label_column": "relatedness_score"},
        "pearson",
    ),
    "entailment": (
        "sick",
        "SICK_train.txt",
        "SICK_test_annotated.txt",
        {"label_column": "entailment_judgment"},
        "accuracy",
    ),
    "rte": ("rte", "train.tsv", "dev.tsv", {}, "accuracy"),
    "emotion": ("emotion", "train.txt", "test.txt", {}, "accuracy"),
    "ner": ("wnut17", "wnut17train.conll", "emerging.test.annotated", {}, "f1"),
}
# Columns a task's files hold but do not learn from (SICK has two label columns: each task keeps its own).
SICK_COLUMNS = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]
DROP = {"regression": ["entailment_judgment"], "entailment": ["relatedness_score"]}


def job_tree(root: Path, task: str, hyperparameters: dict) -> Path:
    """A SageMaker training tree: hyperparameters, and the train and test channels (copies of the files)."""
    name, train, test, needed, _ = TASKS[task]
    data = shared_data.folder(name)
    for channel, file in (("train", train), ("test", test)):
        folder = root / "input" / "data" / channel
        folder.mkdir(parents=True)
        target = folder / file
        if task in DROP:  # the other task's label column out: one label column per table
            import pandas as pd

            headed = (data / file).read_text(encoding="utf-8").startswith("pair_ID")  # SICK's test file has no header
            frame = pd.read_csv(data / file, sep="\t", header=0 if headed else None, names=SICK_COLUMNS)
            frame = frame.drop(columns=DROP[task])
            frame.to_csv(target.with_suffix(".tsv"), sep="\t", index=False)
        else:  # (a CoNLL file under its own name: .annotated is not a data file's name)
            target = target.with_suffix(".conll") if task == "ner" else target
            target.write_bytes((data / file).read_bytes())
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({**needed, **hyperparameters}))
    return root


def run_byoc(task: str, epochs: float, workdir: Path, seed: int = 42) -> dict:
    root = job_tree(workdir / "byoc", task, {"epochs": epochs, **({"seed": seed} if seed != 42 else {})})
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(workdir / "cache")}
    start = time.monotonic()
    out = subprocess.run([str(Path(sys.executable).parent / "byoc"), "train"], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"byoc train failed: {out.stdout[-3000:]}")
    metrics = json.loads((root / "output" / "data" / "metrics.json").read_text())
    # Only a test split is given: byoc scores it as its evaluation split (eval_*).
    scores = {k[5:]: v for k, v in metrics.items() if k.startswith("eval_")}
    return {"scores": scores, "seconds": time.monotonic() - start}


def run_reference(task: str, epochs: float, workdir: Path, seed: int = 42) -> dict:
    """The plain Trainer: the model's defaults, learning rate 5e-5, batch 16, dynamic padding."""
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from byoc.training.data import DataSpec, load_task_data
    from byoc.training.metrics import TaskMetrics
    from byoc.training.model import bundled_model_dir
    from byoc.training.tokenization import tag_encoder

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    root = job_tree(workdir / "reference", task, {})
    needed = TASKS[task][3]
    channels = {c: root / "input" / "data" / c for c in ("train", "test")}
    data = load_task_data(channels, DataSpec(label_column=needed.get("label_column")), workdir / "cache")
    model_dir = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(batch):
        pair = batch["text_pair"] if "text_pair" in batch else None
        encoded = tokenizer(batch["text"], pair, truncation=True)
        encoded["labels"] = batch["label"]
        return encoded

    ner = data.task == "token_classification"
    if ner:  # run_ner.py's recipe: each word's tag on its first sub-token, the others -100
        encode = tag_encoder(tokenizer, tokenizer.model_max_length, False, data.label_names, False)
    train = data.train.map(encode, batched=True, remove_columns=data.train.column_names)
    test = data.test.map(encode, batched=True, remove_columns=data.test.column_names)
    transformers.set_seed(seed)
    if ner:
        model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(data.label_names))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=len(data.label_names), problem_type=data.task
        )
    args = TrainingArguments(
        output_dir=str(workdir / "reference-out"),
        num_train_epochs=epochs,
        learning_rate=LR,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=64,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        data_collator=(DataCollatorForTokenClassification if ner else DataCollatorWithPadding)(tokenizer),
        compute_metrics=TaskMetrics(data.task, data.label_names),
    )
    start = time.monotonic()
    trainer.train()
    scores = trainer.evaluate(test, metric_key_prefix="eval")
    return {"scores": {k[5:]: v for k, v in scores.items()}, "seconds": time.monotonic() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=42, help="both recipes' seed (data order, head, dropout)")
    parser.add_argument("--one", nargs=2, metavar=("RECIPE", "TASK"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    if opts.one:
        recipe, task = opts.one
        with tempfile.TemporaryDirectory() as tmp:
            run = run_byoc if recipe == "byoc" else run_reference
            print("RESULT " + json.dumps(run(task, opts.epochs, Path(tmp), opts.seed)), flush=True)
        return 0
    results: dict[str, dict] = {}
    for task in opts.tasks.split(","):
        if shared_data.find(TASKS[task][0]) is None:
            sys.exit(shared_data.missing(TASKS[task][0]))
        results[task] = {}
        for recipe in ("byoc", "reference"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", recipe, task, "--epochs", str(opts.epochs)]
                + ["--seed", str(opts.seed)],
                capture_output=True,
                text=True,
            )
            line = [row for row in out.stdout.splitlines() if row.startswith("RESULT ")]
            if out.returncode or not line:
                print(out.stdout[-2000:], out.stderr[-3000:])
                return 1
            results[task][recipe] = json.loads(line[0][7:])
            headline = TASKS[task][4]
            print(
                f"{task:12s} {recipe:9s} {headline}={results[task][recipe]['scores'][headline]:.4f} "
                f"({results[task][recipe]['seconds']:.0f} s)",
                flush=True,
            )
    print(f"\n| task | data | metric | byoc defaults | plain Trainer (lr 5e-5, batch 16) | epochs {opts.epochs:g} |")
    print("|---|---|---|---|---|---|")
    for task, runs in results.items():
        headline = TASKS[task][4]
        ours, theirs = runs["byoc"], runs["reference"]
        print(
            f"| {task} | {TASKS[task][0]} | {headline} | {ours['scores'][headline]:.4f} ({ours['seconds']:.0f} s) "
            f"| {theirs['scores'][headline]:.4f} ({theirs['seconds']:.0f} s) | "
            f"{ours['scores'][headline] - theirs['scores'][headline]:+.4f} |"
        )
    if opts.json:
        opts.json.write_text(json.dumps({"epochs": opts.epochs, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
