"""Resilience: interrupt the emotion job again and again, as spot reclaims and crashes would.

Runs the MiniLM emotion job (`byoc train`, real processes) once uninterrupted, then once with
`--cycles` interruptions, alternating SIGTERM (a spot reclaim / stop: 120 s of grace) and SIGKILL
(a crash: no warning), each at a random moment of the run (start-up included), restarting the
job after each one as SageMaker would. Reports, per interruption: the signal, the last step
logged before it, the step the next attempt resumed from (steps lost = the difference), the time
from SIGTERM to exit; and at the end the final accuracy next to the uninterrupted run's and the
largest loss difference over all steps.

    .venv/bin/python benchmarks/resilience.py [--cycles 6] [--train-samples 6000] [--save-steps 20]

Run it alone (a second busy process on these 2 cores slows everything several-fold).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)
import shared_data  # benchmarks/, beside this script
from child_process import dies_with_parent, exit_on_sigterm

REPO = Path(__file__).resolve().parents[1]
DATA = shared_data.find("emotion")
BYOC = str(Path(sys.executable).parent / "byoc")


def make_job(root: Path, args: argparse.Namespace) -> Path:
    (root / "input" / "config").mkdir(parents=True)
    for channel, name in (("train", "train.txt"), ("test", "test.txt")):
        (root / "input" / "data" / channel).mkdir(parents=True)
        shutil.copy(DATA / name, root / "input" / "data" / channel / name)
    hps = {
        "epochs": "1",
        "max_train_samples": str(args.train_samples),
        "max_eval_samples": str(args.eval_samples),
        "save_strategy": "steps",
        "save_steps": str(args.save_steps),
        "logging_steps": "1",
        "seed": "42",
    }
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hps))
    return root


def start(root: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [BYOC, "train"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=dies_with_parent,
    )


def steps_logged(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"\[metrics\] step=(\d+) \S+ loss=", log)]


def resumed_from(log: str) -> int:
    match = re.search(r"resuming from \S*checkpoint-(\d+)", log)
    return int(match.group(1)) if match else 0


def metrics(root: Path) -> dict:
    return json.loads((root / "output" / "data" / "metrics.json").read_text())


def losses(root: Path) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in metrics(root)["history"] if "loss" in h}


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--train-samples", type=int, default=6000)
    parser.add_argument("--eval-samples", type=int, default=2000)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "resilience.json"))
    args = parser.parse_args()
    if DATA is None:
        sys.exit(shared_data.missing("emotion"))
    work = Path(tempfile.mkdtemp(prefix="byoc-resilience-"))
    cache = work / "cache"
    rng = random.Random(args.seed)

    reference = make_job(work / "reference", args)
    began = time.monotonic()
    proc = start(reference, cache)
    out, _ = proc.communicate()
    if proc.returncode:
        sys.exit(out[-3000:])
    duration = time.monotonic() - began
    total_steps = max(steps_logged(out))
    print(f"uninterrupted: {duration:.0f} s, accuracy {metrics(reference)['eval_accuracy']:.4f}", flush=True)

    job = make_job(work / "interrupted", args)
    events: list[dict] = []
    attempts = 0
    while True:
        attempts += 1
        (job / "output" / "failure").unlink(missing_ok=True)
        cycle = len(events)
        sig = (signal.SIGTERM if cycle % 2 == 0 else signal.SIGKILL) if cycle < args.cycles else None
        done = events[-1]["last_step"] if events else 0
        # The first interruption comes during start-up (imports, data, model); the others at a
        # random step of what is left, plus a random fraction of a second (mid-step, mid-save...).
        target = None if cycle == 0 else rng.randint(done + 1, max(done + 1, int(total_steps * 0.95)))
        proc = start(job, cache)
        began = time.monotonic()
        lines: list[str] = []
        sent_at = None
        if sig is not None and target is None:
            delay = rng.uniform(1.0, 5.0)
            threading.Timer(delay, proc.send_signal, (sig,)).start()
            sent_at = began + delay
        for line in proc.stdout:
            lines.append(line)
            if sig is not None and target is not None and sent_at is None and f"[metrics] step={target} " in line:
                time.sleep(rng.uniform(0.0, 0.5))
                sent_at = time.monotonic()
                proc.send_signal(sig)
        proc.wait()
        ended = time.monotonic()
        out = "".join(lines)
        if events:
            events[-1]["resumed_from"] = resumed_from(out)
            events[-1]["steps_lost"] = max(0, events[-1]["last_step"] - events[-1]["resumed_from"])
        if proc.returncode == 0:
            break
        steps = steps_logged(out)
        event = {
            "cycle": cycle + 1,
            "signal": sig.name,
            "after_s": round((sent_at or ended) - began, 1),
            "exit_code": proc.returncode,
            "last_step": steps[-1] if steps else done,
        }
        if sig == signal.SIGTERM and sent_at:
            event["exit_s"] = round(ended - sent_at, 1)
        events.append(event)
        print(json.dumps(event), flush=True)

    ours, theirs = losses(job), losses(reference)
    worst = max(abs(ours[s] - theirs[s]) for s in theirs)
    result = {
        "job": f"all-MiniLM-L6-v2, emotion, 1 epoch of {args.train_samples} tweets, "
        f"checkpoint every {args.save_steps} steps",
        "interruptions": events,
        "survived": sum(1 for e in events if "resumed_from" in e),
        "attempts": attempts,
        "uninterrupted_accuracy": metrics(reference)["eval_accuracy"],
        "final_accuracy": metrics(job)["eval_accuracy"],
        "max_loss_difference": worst,
        "steps": len(theirs),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    harness.write_results(Path(args.out), result)
    print("\n| # | signal | at | last step logged | resumed from | steps lost | SIGTERM to exit |")
    print("|---|---|---|---|---|---|---|")
    for e in events:
        print(
            f"| {e['cycle']} | {e['signal']} | {e['after_s']} s | {e['last_step']} | {e.get('resumed_from', '-')} | "
            f"{e.get('steps_lost', '-')} | {str(e['exit_s']) + ' s' if 'exit_s' in e else '-'} |"
        )
    print(
        f"\nsurvived {result['survived']} of {len(events)} interruptions; "
        f"final accuracy {result['final_accuracy']:.4f} "
        f"(uninterrupted {result['uninterrupted_accuracy']:.4f}); "
        f"largest loss difference over {result['steps']} steps: "
        f"{worst:.2e}"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
