"""Train the jobs behind the tests' thresholds for many seeds of the tiny BERT, and report how far
each threshold is from what the seeds give: a test that checks a trained quantity (accuracy, loss)
must not fail by chance, so its margin is measured here and written next to the assertion.

    python scripts/seed_margins.py --seeds 20 --jobs 2 --json margins.json        # CPU cases
    python scripts/seed_margins.py --seeds 20 --xla                                # + the XLA path (.venv-xla)
    python scripts/seed_margins.py --seeds 20 --gpu --jobs 8                       # + the CUDA cases

Each case is the job of a test in tests/ (built by tests/helpers.py), run by the real `byoc train`
in a process of its own. The tests themselves run seed 0 (BYOC_TEST_SEED).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import helpers  # noqa: E402  (the tests' own job builders)
from helpers import (
    CLASSIFICATION_HP,
    CPU_ONLY,
    DISTRIBUTED_HP,
    GPU_HP,
    SMALL_JOB_HP,
    Job,
    build_job,
    build_tiny_bert,  # noqa: E402
    learned,
    losses,
)


def _train(job: Job, env: dict[str, str]) -> Job:
    done = helpers.run_train_process(job.root, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{job.root}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return job


def xla_cpu_accuracy(root: Path, model: Path, env: dict) -> float:
    """test_xla: the CPU path's eval_accuracy >= 0.9."""
    return _train(
        build_job(root, model, {**CLASSIFICATION_HP, "device": "cpu"}, train=96, test=40), {**env, **CPU_ONLY}
    ).metrics["eval_accuracy"]


def xla_accuracy_gap(root: Path, model: Path, env: dict) -> float:
    """test_xla: |XLA path - CPU path| eval_accuracy <= 0.05."""
    cpu = _train(
        build_job(root / "cpu", model, {**CLASSIFICATION_HP, "device": "cpu"}, train=96, test=40), {**env, **CPU_ONLY}
    )
    xla = _train(
        build_job(root / "xla", model, {**CLASSIFICATION_HP, "device": "xla"}, train=96, test=40),
        {**env, "PJRT_DEVICE": "CPU"},
    )
    return abs(xla.metrics["eval_accuracy"] - cpu.metrics["eval_accuracy"])


def distributed_loss_ratio(root: Path, model: Path, env: dict) -> float:
    """test_distributed: loss at step 160 < 0.5 x loss at step 1 (one rank, batch 8: the same losses
    as two ranks of 4, which that test checks)."""
    job = build_job(root, model, {**DISTRIBUTED_HP, "per_device_train_batch_size": "8"})
    steps = losses(_train(job, {**env, **CPU_ONLY}))
    return steps[160] / steps[1]


def small_job_accuracy(root: Path, model: Path, env: dict) -> float:
    """test_container (>= 0.9) and SDK local mode (== 1.0): eval_accuracy of the 120-step job."""
    return _train(build_job(root, model, SMALL_JOB_HP, test=16), {**env, **CPU_ONLY}).metrics["eval_accuracy"]


def gpu_learned(precision: str) -> Callable[[Path, Path, dict], float]:
    def case(root: Path, model: Path, env: dict) -> float:
        """test_gpu: mean loss of the last 5 of 160 steps < 0.5 x that of the first 5."""
        flags = {"bf16": "true"} if precision == "bf16" else {"fp16": "true"} if precision == "fp16" else {}
        job = build_job(root, model, {**GPU_HP, **flags}, test=32)
        return learned(losses(_train(job, env)), 1, 160)

    return case


# name -> (case, threshold, "min" if values must stay at or above it, "max" if at or below)
CPU_CASES = {
    "xla_cpu_accuracy": (xla_cpu_accuracy, 0.9, "min"),
    "distributed_loss_ratio": (distributed_loss_ratio, 0.5, "max"),
    "small_job_accuracy": (small_job_accuracy, 0.9, "min"),
}
XLA_CASES = {"xla_accuracy_gap": (xla_accuracy_gap, 0.05, "max")}
GPU_CASES = {f"gpu_learned_{p}": (gpu_learned(p), 0.5, "max") for p in ("fp32", "bf16", "fp16")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1, help="jobs at once (CPU threads are split between them)")
    parser.add_argument("--cases", default="", help="comma-separated names (default: the CPU cases)")
    parser.add_argument("--xla", action="store_true", help="add the XLA case (needs torch-xla: .venv-xla)")
    parser.add_argument("--gpu", action="store_true", help="add the CUDA cases (needs a GPU)")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    cases = {**CPU_CASES, **(XLA_CASES if opts.xla else {}), **(GPU_CASES if opts.gpu else {})}
    if opts.cases:
        cases = {k: v for k, v in {**CPU_CASES, **XLA_CASES, **GPU_CASES}.items() if k in opts.cases.split(",")}
    threads = max(1, (os.cpu_count() or 1) // opts.jobs)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "BYOC_LOG_LEVEL": "WARNING"}
    work = Path(tempfile.mkdtemp(prefix="byoc-seeds-"))
    models = {seed: build_tiny_bert(work / f"model-{seed}", seed) for seed in range(opts.seeds)}
    tasks = [(name, seed) for name in cases for seed in range(opts.seeds)]

    def run(task: tuple[str, int]) -> tuple[str, int, float]:
        name, seed = task
        value = cases[name][0](work / name / str(seed) / "opt-ml", models[seed], env)
        print(f"{name} seed={seed}: {value:.4f}", flush=True)
        return name, seed, value

    with ThreadPoolExecutor(opts.jobs) as pool:
        results = list(pool.map(run, tasks))
    report = {}
    for name, (_, threshold, side) in cases.items():
        values = [v for n, _, v in results if n == name]
        worst = min(values) if side == "min" else max(values)
        failing = sum(v < threshold if side == "min" else v > threshold for v in values)
        report[name] = {
            "threshold": threshold,
            "side": side,
            "seeds": len(values),
            "worst": round(worst, 4),
            "best": round(max(values) if side == "min" else min(values), 4),
            "margin": round(abs(worst - threshold), 4) if not failing else None,
            "seeds_failing": failing,
            "values": [round(v, 4) for v in values],
        }
        print(
            f"{name}: threshold {'>=' if side == 'min' else '<='} {threshold}; worst of {len(values)} seeds "
            f"{worst:.4f}; {failing} failing"
        )
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
