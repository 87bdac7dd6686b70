"""The job's wall time by phase, from the process's start to the model saved: what a whole job costs, and where.

A figure of samples a second leaves out what a short job is mostly made of (issue 59: a one-epoch BERT-base job
on an H100 spent 152 of its first 50 steps' seconds compiling). Each step of the job (`byoc.training.job`, and a
`code/train.py` that calls them) marks the clock as it ends, and the training steps are timed one by one, those
that compiled a graph apart, so metrics.json's `phases_seconds` splits the whole job into:

    startup       the process's start to the job's first step: interpreter, imports, settings
    data          reading, mining negatives, tokenizing, buckets
    model         loading the model, building the Trainer
    compilation   the training steps that compiled a graph, less what an ordinary step takes
    training      every other training step, checkpoints and logging
    evaluation    the evaluations (during training, final, test predictions, a retrieval set)
    saving        the model folder: weights, tokenizer, serving graph, code
    total         the process's start to the end; the phases add up to it
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

PHASES = ("startup", "data", "model", "compilation", "training", "evaluation", "saving")


def process_seconds() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0, and the startup phase is then unknown)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


class Clock:
    """Time spent between marks, by the name each mark gives the stretch that ends there."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.spent: dict[str, float] = {"startup": process_seconds()}
        self.steps = StepClock()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.spent[name] = self.spent.get(name, 0.0) + now - self.last
        self.last = now

    def summary(self, history: list[dict[str, Any]]) -> dict[str, float]:
        """The phases, in seconds: the marks' stretches, the training one split into its compiling steps, its
        evaluations (the Trainer's runtimes in `history`) and the rest."""
        spent = dict(self.spent)
        evaluated = sum(float(entry["eval_runtime"]) for entry in history if "eval_runtime" in entry)
        compiled = min(self.steps.compile_seconds(), spent.get("training", 0.0))
        spent["compilation"] = compiled
        spent["training"] = max(0.0, spent.get("training", 0.0) - compiled - evaluated)
        spent["evaluation"] = spent.get("evaluation", 0.0) + evaluated
        out = {name: round(spent.get(name, 0.0), 2) for name in PHASES}
        out["total"] = round(spent["startup"] + time.monotonic() - self.began, 2)
        return out

    def report(self, metrics_path: Path, history: list[dict[str, Any]]) -> dict[str, float]:
        """Log the phases and add them to metrics.json (`phases_seconds`), which the job wrote before it saved."""
        phases = self.summary(history)
        logger.info("[phases] %s", " ".join(f"{name}={seconds}s" for name, seconds in phases.items()))
        try:
            report = json.loads(metrics_path.read_text(encoding="utf-8"))
            report["phases_seconds"] = phases
            metrics_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except (OSError, ValueError) as err:  # a report line must never fail a finished job
            logger.warning("could not add the phases to %s: %s", metrics_path, err)
        return phases


class StepClock(TrainerCallback):
    """Each training step's wall time, those in which `graphs` (the compiled graphs so far) grew apart: their time
    beyond an ordinary step's (the median of the others) is the compilation's."""

    def __init__(self) -> None:
        self.graphs: Callable[[], int] | None = None  # set where the step compiles (CompileReport's counter)
        self.measured: float | None = None  # the compiler's own figure, where it keeps one (XLA's)
        self.ordinary: list[float] = []
        self.compiling: list[float] = []
        self._began = 0.0
        self._count = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._count = self.graphs() if self.graphs else 0
        self._began = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        took = time.monotonic() - self._began
        grew = self.graphs is not None and self.graphs() > self._count
        (self.compiling if grew else self.ordinary).append(took)

    def compile_seconds(self) -> float:
        if self.measured is not None:
            return self.measured
        typical = statistics.median(self.ordinary) if self.ordinary else 0.0
        return sum(max(0.0, took - typical) for took in self.compiling)
