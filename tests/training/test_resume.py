"""Spot interruptions and crashes on real processes: SIGTERM at each phase of a job saves what
there is to save and the rerun resumes exactly; SIGKILL at random moments loses at most one
checkpoint interval; half-written checkpoints are never loaded."""

from __future__ import annotations

import json
import random
import shutil
import signal
import sys

import pytest

from helpers import (
    CPU_ONLY,
    REPO,
    RESUME_HP,
    Job,
    assert_same_losses,
    build_job,
    losses,
    rerun,
    run_until,
    sentiment_rows,
    start_train,
    stopped_step,
    write_csv,
)

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir) -> Job:
    job = build_job(tmp_path_factory.mktemp("reference") / "opt-ml", tiny_model_dir, RESUME_HP)
    assert rerun(job)
    return job


def test_sigterm_mid_epoch_saves_and_the_rerun_resumes_exactly(tmp_path, tiny_model_dir, reference):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, RESUME_HP)
    code, log = run_until(job, "[metrics] step=13 ")
    assert code == 143, log[-3000:]
    step = stopped_step(job)
    assert 13 <= step < 120 and "resumes" in job.failure
    assert (job.root / "checkpoints" / f"checkpoint-{step}" / "byoc-complete.json").exists()
    assert not (job.model_dir / "model.safetensors").exists()
    log = rerun(job)
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{step}'}" in log
    assert (job.model_dir / "model.safetensors").exists()
    assert_same_losses(job, reference, after=step)


def test_code_train_py_as_the_users_script_stops_and_resumes_exactly(tmp_path, tiny_model_dir, reference):
    """code/train.py, the script users copy, run in script mode (entry_point + source_dir): SIGTERM
    saves a checkpoint and exits 143, and the rerun resumes at that step with the uninterrupted losses."""
    script_mode = {
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps(str(REPO / "code")),
    }
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**RESUME_HP, **script_mode})
    code, log = run_until(job, "[metrics] step=13 ")
    assert code == 143, log[-3000:]
    assert "script mode: running train.py" in log
    step = stopped_step(job)
    assert (job.root / "checkpoints" / f"checkpoint-{step}" / "byoc-complete.json").exists()
    log = rerun(job)
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{step}'}" in log
    assert (job.model_dir / "model.safetensors").exists() and (job.model_dir / "code" / "inference.py").exists()
    assert_same_losses(job, reference, after=step)


def test_sigterm_around_a_checkpoint_write(tmp_path, tiny_model_dir, reference):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, RESUME_HP)
    code, log = run_until(job, "[metrics] step=20 ")  # logged just before checkpoint-20 is written
    assert code == 143, log[-3000:]
    step = stopped_step(job)
    assert (job.root / "checkpoints" / f"checkpoint-{step}" / "byoc-complete.json").exists()
    rerun(job)
    assert_same_losses(job, reference, after=step)


def test_sigterm_while_preparing_stops_at_once_with_nothing_to_save(tmp_path, tiny_model_dir):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, RESUME_HP, train=4000)
    code, log = run_until(job, "byoc.training.data.columns: train: ")
    assert code == 143, log[-3000:]
    assert job.failure.startswith("stopped by SIGTERM while preparing the job"), job.failure
    assert "nothing was lost" in job.failure
    assert not (job.root / "checkpoints").exists() or not list((job.root / "checkpoints").glob("checkpoint-*"))


def test_sigterm_right_at_start_up_ends_cleanly(tmp_path, tiny_model_dir):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, RESUME_HP)
    code, log = run_until(job, "training job local")  # the first line: torch is not even imported yet
    assert code == 143, log[-3000:]
    assert job.failure.startswith("stopped by SIGTERM while "), job.failure
    assert "Traceback" not in log


# `byoc train` with a finalizer that gets the SIGTERM: the handler runs inside `__del__`, where
# Python prints what it raises as "Exception ignored" and carries on (it happened in CI, in regex's
# Group.__del__, and the job trained to the end). RESEND_AFTER_S=3600 leaves the stop to the checks.
SIGTERM_IN_A_FINALIZER = """
import signal, sys
from byoc import cli
from byoc.training import hyperparameters as arguments
from byoc.training import stopping

stopping.RESEND_AFTER_S = float(sys.argv[1])
parse = arguments.parse_hyperparameters

class SigtermInAFinalizer:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)

def parse_once(*args, **kwargs):
    arguments.parse_hyperparameters = parse
    SigtermInAFinalizer()
    return parse(*args, **kwargs)

arguments.parse_hyperparameters = parse_once
cli.main(["train"])
"""


@pytest.mark.parametrize("resend_after", ["0.05", "3600"], ids=["sent-again", "checked-later"])
def test_a_sigterm_swallowed_by_a_finalizer_still_stops_the_job(tmp_path, tiny_model_dir, resend_after):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, RESUME_HP)
    proc = start_train(job.root, command=[sys.executable, "-c", SIGTERM_IN_A_FINALIZER, resend_after])
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, log[-3000:]
    assert job.failure.startswith("stopped by SIGTERM while starting the job"), job.failure
    assert "delivering it again" in log and "Exception ignored" not in log
    assert not (job.model_dir / "model.safetensors").exists()


def few_validation_rows(job: Job) -> None:
    """The rerun's evaluations need not be long (3,000 rows only gave the SIGTERM time to land in one); the
    validation data is not part of what a checkpoint must match (byoc.training.job._job_fingerprint)."""
    write_csv(job.channel("validation") / "v.csv", sentiment_rows(40))


def test_sigterm_during_an_evaluation_cuts_it_short(tmp_path, tiny_model_dir):
    extra = {
        "max_steps": "40",
        "eval_strategy": "steps",
        "eval_steps": "20",
        "save_strategy": "no",
        "per_device_eval_batch_size": "1",
    }
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra}, validation=3000)
    code, log = run_until(job, "[metrics] step=20 ")  # the evaluation of step 20 starts right after
    assert code == 143, log[-3000:]
    assert job.failure.startswith("stopped by SIGTERM at step 20 of 40 (during an evaluation)"), job.failure
    assert "eval_loss=" not in log  # its 3,000 batches were cut short: it never reached its metrics line
    few_validation_rows(job)
    log = rerun(job)
    # The SIGTERM saved step 20; the rerun trains steps 21-40 from it and evaluates at the end.
    assert f"resuming from {job.root / 'checkpoints' / 'checkpoint-20'}" in log, log[-3000:]
    assert set(losses(job)) >= set(range(21, 41)) and (job.model_dir / "model.safetensors").exists()
    assert "eval_accuracy" in job.metrics  # the final evaluation ran, after the resumed training


def test_sigterm_during_the_final_evaluation_keeps_the_training(tmp_path, tiny_model_dir):
    extra = {"max_steps": "30", "save_strategy": "no", "per_device_eval_batch_size": "1"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra}, validation=3000)
    code, log = run_until(job, "train_runtime=")  # training is over; the final evaluation starts
    assert code == 143, log[-3000:]
    assert job.failure.startswith("stopped by SIGTERM at step 30 of 30 (the final evaluation)"), job.failure
    few_validation_rows(job)
    log = rerun(job)
    assert "checkpoint-30" in log and "eval_accuracy" in job.metrics
    assert len(losses(job)) == 30


def test_a_sealed_checkpoint_corrupted_in_place_falls_back_to_the_previous_one(tmp_path, tiny_model_dir):
    """Issue 21: garbage written over the newest checkpoint's trainer_state.json, its size unchanged,
    blocked every restart with "unexpected error: JSONDecodeError"; the restart now resumes from the
    checkpoint before it, says which folder it skipped, and trains to the end."""
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**RESUME_HP, "max_steps": "30"})
    rerun(job)
    checkpoints = job.root / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-30"]
    state = checkpoints / "checkpoint-30" / "trainer_state.json"
    size = state.stat().st_size
    state.write_bytes((b"\x00\xff garbage " * size)[:size])
    assert state.stat().st_size == size
    shutil.rmtree(job.model_dir)
    log = rerun(job)
    assert f"skipping the checkpoint {checkpoints / 'checkpoint-30'}: it was sealed but cannot be loaded" in log
    assert f"resuming from {checkpoints / 'checkpoint-20'}" in log
    assert (job.model_dir / "model.safetensors").exists() and set(losses(job)) >= set(range(21, 31))
    assert json.loads(state.read_text())["global_step"] == 30  # written again by the resumed run


@pytest.mark.once  # byoc's own sealed checkpoints against an OS kill; the SIGTERM tests run in both tiers
def test_sigkill_at_random_moments_loses_at_most_one_checkpoint_interval(tmp_path, tiny_model_dir):
    """Kill -9 six times, each at a random moment of the job's own progress, never of the clock, so
    that every kill lands on a machine of any speed: every other kill at a random line of start-up
    (reading data, loading the model, resuming a checkpoint...), the others at a random step of
    training, one of them at a step whose checkpoint is being written. After each kill the newest
    sealed checkpoint is at most save_steps behind the last logged step, the restart resumes from it
    (never from a half-written one), and the job run to its end has the uninterrupted run's losses."""
    extra = {"max_steps": "200"}  # the kill steps below are 100 at most: the job never ends first
    save_steps = int(RESUME_HP["save_steps"])
    reference = build_job(tmp_path / "reference" / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra})
    start_up = rerun(reference, CPU_ONLY).split("[metrics] step=")[0].count("\n")
    job = build_job(tmp_path / "killed" / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra})
    from byoc.training.checkpoints import newest_complete

    rng = random.Random(7)
    saved, resumed_from = 0, []
    for kill in range(6):
        if kill % 2 == 0:  # at the n-th line of start-up, or at the first step if start-up ends sooner
            at_line, at_step = rng.randint(1, start_up), None
        else:  # at a step after the resume point; the second time, one whose checkpoint is being written
            at_line, at_step = None, saved + (2 * save_steps if kill == 3 else rng.randint(1, 4 * save_steps))
        proc = start_train(job.root, CPU_ONLY)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if len(lines) == at_line or (at_step is None and "[metrics] step=" in line):
                break
            if at_step is not None and f"[metrics] step={at_step} " in line:
                break
        proc.kill()
        out, _ = proc.communicate(timeout=300)
        log = "".join(lines) + out
        assert proc.returncode == -signal.SIGKILL, f"kill {kill} missed: the job ended first\n{log[-3000:]}"
        # The restart resumed from the newest sealed checkpoint, never a half-written one (a kill at
        # start-up may come before it says so; a kill mid-training comes after).
        resumes = [line.split("resuming from ")[1].strip() for line in log.splitlines() if "resuming from " in line]
        assert resumes == [str(job.root / "checkpoints" / f"checkpoint-{saved}")] * len(resumes), (resumes, saved)
        assert resumes or not (at_step and saved), log[-3000:]
        steps = [int(line.split("step=")[1].split()[0]) for line in log.splitlines() if "[metrics] step=" in line]
        newest = newest_complete(job.root / "checkpoints")
        saved = int(newest.name.split("-")[1]) if newest else 0
        assert max(steps, default=saved) - saved <= save_steps, (steps[-1:], saved)
        resumed_from.append(saved)
    log = rerun(job, CPU_ONLY)
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{saved}'}" in log
    assert max(resumed_from) > 0  # the mid-training kills left checkpoints behind
    assert_same_losses(job, reference)
