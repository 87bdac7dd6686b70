"""Spot interruptions: a real SIGTERM saves a checkpoint; the restarted job resumes at that step
and trains exactly what an uninterrupted job trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Job, sentiment_rows, write_csv

HP = {"max_steps": "120", "logging_steps": "1", "learning_rate": "1e-3", "per_device_train_batch_size": "8",
      "warmup_ratio": "0.1"}


def make_job(root: Path, tiny_model_dir: Path, hyperparameters: dict | None = None) -> Job:
    job = Job(root).resources()
    job.hyperparameters(hyperparameters or HP)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(64))
    return job


def start(job: Job) -> subprocess.Popen:
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.root), "BYOC_CACHE_DIR": str(job.root.parent / "cache")}
    return subprocess.Popen([str(Path(sys.executable).parent / "byoc"), "train"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def losses(job: Job) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in job.metrics["history"] if "loss" in h}


def test_sigterm_saves_and_the_rerun_resumes_exactly(tmp_path, tiny_model_dir):
    reference = make_job(tmp_path / "a" / "opt-ml", tiny_model_dir)
    done = start(reference)
    assert done.wait(300) == 0, done.stdout.read()[-2000:]

    job = make_job(tmp_path / "b" / "opt-ml", tiny_model_dir)
    proc = start(job)
    output = []
    for line in proc.stdout:  # SIGTERM once training is under way, as SageMaker would
        output.append(line)
        if "[metrics] step=10 " in line:
            proc.send_signal(signal.SIGTERM)
            break
    output.append(proc.stdout.read())
    assert proc.wait(120) == 143, "".join(output)[-3000:]
    failure = job.failure
    assert "stopped by SIGTERM at step" in failure and "resumes" in failure
    step = int(failure.split("at step ")[1].split()[0])
    assert 10 <= step < 120
    assert (job.root / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").exists()
    assert not (job.model_dir / "model.safetensors").exists()

    (job.root / "output" / "failure").unlink()  # SageMaker starts the next attempt with a clean output/
    rerun = start(job)
    log = rerun.stdout.read()
    assert rerun.wait(300) == 0, log[-3000:]
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{step}'}" in log
    assert (job.model_dir / "model.safetensors").exists()
    ours, theirs = losses(job), losses(reference)
    assert set(ours) == set(theirs) == set(range(1, 121))
    for s in range(step + 1, 121):  # the steps trained after the resume
        assert ours[s] == pytest.approx(theirs[s], rel=1e-4, abs=1e-5), s


FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors", "rng_state.pth")


def fake_checkpoint(root: Path, step: int, files=FILES, seal: bool = True) -> Path:
    from byoc.checkpoints import mark_complete

    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(f"{name} of step {step}")
    if seal:
        mark_complete(folder)
    return folder


def test_half_written_checkpoint_is_skipped(tmp_path):
    from byoc.checkpoints import newest_complete

    fake_checkpoint(tmp_path, 5)
    fake_checkpoint(tmp_path, 10, seal=False)  # killed before it was sealed
    assert newest_complete(tmp_path) == tmp_path / "checkpoint-5"
    truncated = fake_checkpoint(tmp_path, 15)
    (truncated / "optimizer.pt").write_text("cut")  # a file changed after sealing: not trusted
    assert newest_complete(tmp_path) == tmp_path / "checkpoint-5"


def test_sealing_refuses_a_checkpoint_with_missing_files(tmp_path):
    with pytest.raises(RuntimeError, match="missing rng_state.pth"):
        fake_checkpoint(tmp_path, 3, files=FILES[:-1])


def test_rotation_waits_for_the_new_checkpoint(tmp_path):
    from byoc.checkpoints import drop_unfinished_after, rotate

    for step in (10, 20):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 30, seal=False)
    rotate(tmp_path, 1)  # keep 1: checkpoint-20 stays, since 30 is not complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "checkpoint-30"]
    drop_unfinished_after(tmp_path, tmp_path / "checkpoint-20")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20"]


def test_changed_configuration_is_refused(tmp_path):
    from byoc.checkpoints import CheckpointMismatch, check_job

    fake_checkpoint(tmp_path, 3)
    check_job(tmp_path, {"learning_rate": 1e-3, "seed": 42})
    check_job(tmp_path, {"learning_rate": 1e-3, "seed": 42})  # same job: fine
    with pytest.raises(CheckpointMismatch, match="learning_rate 0.001 -> 0.002"):
        check_job(tmp_path, {"learning_rate": 2e-3, "seed": 42})
