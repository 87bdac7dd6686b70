"""Serving speed of every task: `byoc serve` with a single-label, a multi-label, a regression and a
token classification (NER) model, against the transformers pipeline of the same task.

Same machine, same run, same encoder (all-MiniLM-L6-v2 with each task's head, exported as byoc
publishes it: model.safetensors + model.onnx), same sentences (emotion test tweets), 127.0.0.1 only.
For each task:
- byoc: `byoc serve` (ONNX Runtime, fp32) over HTTP, 16 sentences per JSON request at concurrency 8:
  sentences/s over a fixed window after a warm-up;
- pipeline: the transformers pipeline of the task (text-classification with the task's function,
  or token-classification with aggregation_strategy="simple") in this process, batch_size 16, torch
  with every core, no HTTP: a generous baseline.
Reports each task's byoc throughput against single-label's (issue 29: within 20%) and against its
pipeline (at least 2x). Run it alone: it measures throughput on these 2 cores.

    .venv/bin/python benchmarks/bench_task_serve.py [--seconds 10] [--warmup 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
import shared_data  # noqa: E402
from child_process import exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-task-serve")
TASKS = {
    "single_label_classification": ["anger", "fear", "joy", "love", "sadness", "surprise"],
    "multi_label_classification": ["anger", "fear", "joy", "love", "sadness", "surprise"],
    "regression": ["score"],
    "token_classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
}


def build_model(task: str) -> Path:
    """MiniLM with the task's head (seeded), saved as byoc publishes it, under WORK/<task>/model."""
    import torch
    import transformers

    from byoc import onnx_graph
    from byoc.tasks import get as task_named
    from byoc.training.model import bundled_model_dir

    target = WORK / task / "model"
    if (target / "model.onnx").exists():
        return target
    names = TASKS[task]
    torch.manual_seed(0)
    kwargs = {} if task == "token_classification" else {"problem_type": task}
    model = getattr(transformers, task_named(task).auto_class).from_pretrained(
        bundled_model_dir(),
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        **kwargs,
    )
    if task == "token_classification":
        # An untrained head tags tokens at random: a dozen entities per tweet, where a trained NER model
        # finds one or two (95% of WNUT-17's tokens are O). Tilted towards O, the answers have a real size.
        with torch.no_grad():
            model.classifier.bias[0] += 4.0
    shutil.rmtree(target, ignore_errors=True)
    model.save_pretrained(target, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(target)
    assert onnx_graph.export(target) is not None
    return target


def byoc_rate(model: Path, texts: list[str], opts) -> float:
    port = servers.free_port()
    proc, started = servers.start_byoc(model, port, {"BYOC_INFERENCE_BACKEND": "onnxruntime"})
    try:
        reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        result = servers.run_load(port, texts, 16, 8, opts.warmup, opts.seconds)
        if result.get("errors"):
            raise RuntimeError(f"{model}: {result['errors']} failed requests")
        return result["sentences_per_second"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def pipeline_rate(model: Path, task: str, texts: list[str], seconds: float) -> float:
    from transformers import pipeline

    if task == "token_classification":
        run = pipeline("token-classification", model=str(model), device="cpu", aggregation_strategy="simple")
        kwargs = {}
    else:
        run = pipeline("text-classification", model=str(model), device="cpu")
        function = {"multi_label_classification": "sigmoid", "regression": "none"}.get(task, "softmax")
        kwargs = {"function_to_apply": function, "top_k": None if task == "multi_label_classification" else 1}
    run(texts[:32], batch_size=16, **kwargs)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = texts[done % (len(texts) - 160) :][:160]
        run(batch, batch_size=16, **kwargs)
        done += len(batch)
    return done / (time.perf_counter() - start)


def rates(model: Path, task: str, texts: list[str], opts: argparse.Namespace) -> dict[str, float]:
    """One task: byoc serve's rate, then the transformers pipeline's on the same model."""
    rate = {"byoc": byoc_rate(model, texts, opts), "pipeline": pipeline_rate(model, task, texts, opts.seconds)}
    print(f"{task:28s} byoc {rate['byoc']:7.1f}  pipeline {rate['pipeline']:7.1f} sentences/s", flush=True)
    return rate


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if fixtures.EMOTION is None:
        sys.exit(shared_data.missing("emotion"))
    texts = fixtures.sentences()
    models = {task: build_model(task) for task in TASKS}
    results = harness.scenarios(
        {task: lambda task=task: rates(models[task], task, texts, opts) for task in TASKS}, opts.rounds
    )
    single = results["single_label_classification"]["byoc"]
    print("\n| task | byoc serve, sentences/s | vs single-label | pipeline, sentences/s | byoc / pipeline |")
    print("|---|---|---|---|---|")
    for task, r in results.items():
        print(
            f"| {task} | {r['byoc']:.0f} | {r['byoc'] / single:.2f}x | {r['pipeline']:.0f} | "
            f"{r['byoc'] / r['pipeline']:.2f}x |"
        )
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
