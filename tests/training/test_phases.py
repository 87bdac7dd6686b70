"""byoc.training.phases: a job's wall time by phase, from its process's start to its model saved (metrics.json's
`phases_seconds`), the compiling steps' excess over an ordinary step apart."""

from __future__ import annotations

import pytest

from byoc.training import entry, phases
from helpers import sentiment_rows, write_csv


def test_steps_that_compiled_count_their_excess_over_an_ordinary_step():
    clock = phases.StepClock()
    clock.ordinary, clock.compiling = [0.1, 0.2, 0.1, 0.1], [3.1, 0.05]
    assert clock.compile_seconds() == pytest.approx(3.0)  # (a compiling step under the median adds nothing)
    clock.measured = 7.5  # the compiler's own figure (XLA's) wins
    assert clock.compile_seconds() == 7.5


def test_the_phases_split_training_and_add_up_to_the_whole():
    clock = phases.Clock()
    clock.spent = {"startup": 1.0, "data": 2.0, "model": 1.5, "training": 20.0, "evaluation": 0.5, "saving": 3.0}
    clock.began = clock.last - 27.0  # (the marks' stretches, startup aside)
    clock.steps.ordinary, clock.steps.compiling = [0.2] * 10, [5.2]
    history = [{"loss": 1.0}, {"eval_runtime": 1.25}, {"eval_runtime": 0.75, "eval_loss": 0.5}]
    summary = clock.summary(history)
    assert summary["compilation"] == 5.0 and summary["evaluation"] == 2.5
    assert summary["training"] == 20.0 - 5.0 - 2.0
    assert set(summary) == {*phases.PHASES, "total"}
    assert sum(summary[name] for name in phases.PHASES) == pytest.approx(summary["total"], abs=0.05)


@pytest.mark.integration
def test_a_jobs_metrics_give_its_phases(job, tiny_model_dir):
    job.hyperparameters({"max_steps": "6", "logging_steps": "3", "per_device_train_batch_size": "8", "device": "cpu"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(48))
    write_csv(job.channel("validation") / "val.csv", sentiment_rows(16))
    assert entry.train() == 0, job.failure
    spent = job.metrics["phases_seconds"]
    assert set(spent) == {*phases.PHASES, "total"} and all(value >= 0 for value in spent.values())
    assert spent["startup"] > 0 and spent["data"] > 0 and spent["training"] > 0  # (Linux: the process's start known)
    assert spent["evaluation"] > 0 and spent["saving"] > 0 and spent["compilation"] == 0  # (eager: nothing compiled)
    assert sum(spent[name] for name in phases.PHASES) == pytest.approx(spent["total"], rel=0.05, abs=0.5)
