"""Training embedding models: `byoc train` with its defaults against sentence-transformers' own training
(SentenceTransformerTrainer: the same loss, batch 16, learning rate 5e-5, warmup 10%, the same epochs),
both fine-tuning the bundled all-MiniLM-L6-v2 on the CPU, scored by the same code on SICK's test split.

  scored   SICK train's pairs and relatedness scores (1-5): CoSENT. Scored by the Spearman correlation of
           the cosine with the test pairs' scores (the pretrained model's own figure beside it).
  pairs    SICK train's ENTAILMENT pairs as (anchor, positive) rows: in-batch negatives (multiple-negatives
           ranking). Scored by MRR@10 of each test ENTAILMENT pair's first sentence finding its second
           among all of them, and by the Spearman of the scored test pairs.

byoc's run is a real `byoc train` job on a temporary /opt/ml tree (only `epochs` and the task's data given);
every model is then encoded by sentence-transformers from the folder the run wrote.

    .venv/bin/python benchmarks/bench_embed_train.py [--shapes scored,pairs] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fixtures  # benchmarks/, beside this script (the shared models and data)
import harness  # (benchmarks/: every results file with its provenance)
import numpy as np
from child_process import byoc_train, exit_on_sigterm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))

from byoc import compat  # noqa: E402
from byoc.tasks.embedding import retrieval_metrics  # noqa: E402
from byoc.tasks.regression import regression_metrics  # noqa: E402
from byoc.training.model import bundled_model_dir  # noqa: E402

BATCH, LR = fixtures.EMBED_BATCH, fixtures.EMBED_LR
SEED = [42]  # --seed: both recipes'


def train_rows(shape: str) -> list[dict]:
    rows = fixtures.sick("SICK_train.txt")
    if shape == "scored":
        return [
            {"sentence1": r["sentence_A"], "sentence2": r["sentence_B"], "score": float(r["relatedness_score"])}
            for r in rows
        ]
    return [
        {"anchor": r["sentence_A"], "positive": r["sentence_B"]}
        for r in rows
        if r["entailment_judgment"] == "ENTAILMENT"
    ]


BYOC_EXTRA: dict[str, str] = {}  # --byoc key=value,...: hyperparameters beyond byoc's defaults


def run_byoc(shape: str, epochs: float, workdir: Path) -> tuple[Path, float]:
    root = workdir / "byoc" / "opt-ml"
    (root / "input/config").mkdir(parents=True)
    (root / "input/data/train").mkdir(parents=True)
    hyperparameters = {"epochs": str(epochs), **({"task": "embedding"} if shape == "scored" else {}), **BYOC_EXTRA}
    if SEED[0] != 42:
        hyperparameters["seed"] = str(SEED[0])
    (root / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    with (root / "input/data/train/train.jsonl").open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in train_rows(shape))
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(workdir / "cache")}
    start = time.perf_counter()
    done = byoc_train(env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"byoc train failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return root / "model", time.perf_counter() - start


def run_reference(shape: str, epochs: float, workdir: Path) -> tuple[Path, float]:
    """sentence-transformers' own recipe: SentenceTransformerTrainer, its loss for the shape."""
    import datasets
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    SentenceTransformer, _, _, losses = compat.sentence_transformers_api()
    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    rows = train_rows(shape)
    data = datasets.Dataset.from_list(rows)
    loss = losses.CoSENTLoss(model) if shape == "scored" else losses.MultipleNegativesRankingLoss(model)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(workdir / "reference-checkpoints"),
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        warmup_ratio=0.1,
        seed=SEED[0],
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        **({"batch_sampler": "no_duplicates"} if shape == "pairs" else {}),
    )
    start = time.perf_counter()
    SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
    folder = workdir / "reference"
    model.save(str(folder))
    return folder, time.perf_counter() - start


def scores(folder: Path) -> dict[str, float]:
    """The model's test figures: Spearman of cosine on every scored pair; MRR@10 and recall@1 on ENTAILMENT pairs."""
    SentenceTransformer, _, _, _ = compat.sentence_transformers_api()
    model = SentenceTransformer(str(folder), device="cpu")
    test = fixtures.sick("SICK_test_annotated.txt")

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)

    first, second = encode([r["sentence_A"] for r in test]), encode([r["sentence_B"] for r in test])
    spearman = regression_metrics((first * second).sum(axis=1), np.array([float(r["relatedness_score"]) for r in test]))
    entail = np.array([r["entailment_judgment"] == "ENTAILMENT" for r in test])
    retrieval = retrieval_metrics(first[entail], second[entail])
    return {
        "spearman_cosine": spearman["spearmanr"],
        "mrr_at_10": retrieval["mrr_at_10"],
        "recall_at_1": retrieval["recall_at_1"],
    }


def trained(run: Callable, shape: str, epochs: float, recipe: str) -> dict:
    """One recipe trained on one shape of SICK in a folder of its own, then scored."""
    with tempfile.TemporaryDirectory(prefix="bench-embed-train-") as tmp:
        folder, seconds = run(shape, epochs, Path(tmp) / recipe)
        figures = scores(folder)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in figures.items())
    print(f"{shape:7s} {epochs:g} epoch(s) {recipe:22s} {shown}  ({seconds:.0f} s)", flush=True)
    return {**figures, "train_seconds": round(seconds, 1)}


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="scored,pairs")
    parser.add_argument("--epochs", default="1")
    parser.add_argument("--byoc", default="", help="byoc hyperparameters beyond its defaults: key=value,...")
    parser.add_argument("--recipes", default="byoc,sentence-transformers")
    parser.add_argument("--seed", type=int, default=42)
    harness.add_rounds(parser)
    options = parser.parse_args()
    SEED[0] = options.seed
    BYOC_EXTRA.update(dict(kv.split("=", 1) for kv in options.byoc.split(",") if kv))
    experiment = bool(BYOC_EXTRA) or options.recipes != "byoc,sentence-transformers" or options.seed != 42
    results: dict = {}
    if not experiment:
        results["pretrained"] = scores(bundled_model_dir())
        shown = json.dumps({k: round(v, 4) for k, v in results["pretrained"].items()})
        print(f"pretrained all-MiniLM-L6-v2: {shown}", flush=True)
    recipes = {"byoc": run_byoc, "sentence-transformers": run_reference}
    declared = {
        f"{shape}/{epochs:g}/{recipe}": lambda shape=shape, epochs=epochs, recipe=recipe: trained(
            recipes[recipe], shape, epochs, recipe
        )
        for shape in options.shapes.split(",")
        for epochs in (float(e) for e in options.epochs.split(","))
        for recipe in options.recipes.split(",")
    }
    results.update(harness.scenarios(declared, options.rounds))
    results["rounds"] = options.rounds
    if experiment:
        return 0  # the recorded results stay the defaults'
    out = REPO / "benchmarks" / "results" / "embed_train.json"
    out.parent.mkdir(exist_ok=True)
    harness.write_results(out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
