"""Checkpoints on disk, without a job: sealing, half-written checkpoints, rotation, and the job
record that refuses another configuration's checkpoints (test_resume runs the real jobs)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from byoc.training.checkpoints import (
    JOB_FILE,
    CheckpointMismatch,
    check_job,
    drop_after,
    mark_complete,
    newest_complete,
    rotate,
)

FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors", "rng_state.pth")


def fake_checkpoint(root: Path, step: int, files=FILES, seal: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(f"{name} of step {step}")
    if seal:
        mark_complete(folder)
    return folder


def test_half_written_checkpoint_is_skipped(tmp_path):
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
    for step in (10, 20):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 30, seal=False)
    rotate(tmp_path, 1)  # keep 1: checkpoint-20 stays, since 30 is not complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "checkpoint-30"]
    drop_after(tmp_path, tmp_path / "checkpoint-20")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20"]


def loadable_checkpoint(root: Path, step: int) -> Path:
    """A sealed checkpoint in the formats the Trainer writes: JSON state, torch files, safetensors weights."""
    import torch
    from safetensors.torch import save_file

    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 100, "log_history": []}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": torch.arange(1000.0) * step}, folder / name)
    save_file({"weight": torch.ones(64, 64) * step}, str(folder / "model.safetensors"))
    mark_complete(folder)
    return folder


def overwrite_in_place(path: Path, offset: int = 0, garbage: bytes = b"\x00garbage\xff" * 4) -> None:
    """Bytes replaced by garbage of the same length: the size the seal recorded does not change."""
    data = bytearray(path.read_bytes())
    offset = offset if offset >= 0 else len(data) + offset
    data[offset : offset + len(garbage)] = garbage
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "name,offset",
    [("trainer_state.json", 0), ("optimizer.pt", 600), ("rng_state.pth", -200), ("model.safetensors", 8)],
)
def test_a_sealed_checkpoint_that_cannot_load_is_skipped_for_the_previous_one(tmp_path, caplog, name, offset):
    """Issue 21: a same-size corruption of the newest checkpoint blocked every restart (JSONDecodeError)."""
    from byoc.training.checkpoints import common_resume_point, unreadable

    loadable_checkpoint(tmp_path, 10)
    newest = loadable_checkpoint(tmp_path, 20)
    assert common_resume_point(tmp_path) == newest and unreadable(newest) is None
    overwrite_in_place(newest / name, offset)
    assert newest_complete(tmp_path) == newest  # still sealed: every size is what it was
    with caplog.at_level("WARNING", logger="byoc.training.checkpoints"):
        assert common_resume_point(tmp_path) == tmp_path / "checkpoint-10"
    assert f"skipping the checkpoint {newest}: it was sealed but cannot be loaded" in caplog.text
    drop_after(tmp_path, tmp_path / "checkpoint-10")  # the resumed run writes checkpoint-20 again, from scratch
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]


@pytest.mark.parametrize(
    "fields",
    [
        {"log_history": "none"},
        {"log_history": [1, 2]},
        {"epoch": "one"},
        {"max_steps": 1.5},
        {"best_metric": [0.9]},
        {"train_batch_size": True},
        {"trial_params": "x"},
        {"a_field_from_elsewhere": 1},
    ],
)
def test_a_trainer_state_of_the_wrong_types_is_skipped_for_the_previous_checkpoint(tmp_path, caplog, fields):
    """Issue 28: valid JSON of the wrong types was resumed, and the job died with "unexpected error: TypeError"."""
    from byoc.training.checkpoints import common_resume_point

    loadable_checkpoint(tmp_path, 10)
    newest = loadable_checkpoint(tmp_path, 20)
    state = json.loads((newest / "trainer_state.json").read_text())
    (newest / "trainer_state.json").write_text(json.dumps({**state, **fields}))
    mark_complete(newest)  # sealed again: the sizes match what is there now
    with caplog.at_level("WARNING", logger="byoc.training.checkpoints"):
        assert common_resume_point(tmp_path) == tmp_path / "checkpoint-10"
    name = next(iter(fields))
    assert f"{newest}: it was sealed but cannot be loaded (trainer_state.json: {name}" in caplog.text


def test_a_trainer_state_as_the_trainer_writes_it_is_usable(tmp_path):
    from transformers import TrainerState

    from byoc.training.checkpoints import state_problem

    written = TrainerState(global_step=3, max_steps=9, train_batch_size=16, best_metric=0.5, epoch=1.0)
    written.log_history = [{"loss": 0.5, "step": 3}]
    written.save_to_json(str(tmp_path / "trainer_state.json"))  # as the Trainer saves it
    assert state_problem(json.loads((tmp_path / "trainer_state.json").read_text())) is None


def test_changed_configuration_is_refused(tmp_path):
    fake_checkpoint(tmp_path, 3)
    check_job(tmp_path, {"learning_rate": 1e-3, "seed": 42})
    check_job(tmp_path, {"learning_rate": 1e-3, "seed": 42})  # same job: fine
    with pytest.raises(CheckpointMismatch, match="learning_rate 0.001 -> 0.002"):
        check_job(tmp_path, {"learning_rate": 2e-3, "seed": 42})


def test_an_unreadable_job_record_is_a_clear_mismatch(tmp_path):
    """A job record cut short (written in place by earlier versions, killed mid-write) blocked every
    later resume with a JSONDecodeError; now it is a user error that says what to do."""
    fake_checkpoint(tmp_path, 3)
    (tmp_path / JOB_FILE).write_text('{"learning_rate": 0.0')
    with pytest.raises(CheckpointMismatch, match=f"{JOB_FILE} is unreadable .*Delete .* to resume from them anyway"):
        check_job(tmp_path, {"learning_rate": 1e-3})
    (tmp_path / JOB_FILE).write_text("[1, 2]")
    with pytest.raises(CheckpointMismatch, match="a JSON list, not an object"):
        check_job(tmp_path, {"learning_rate": 1e-3})


PADDING = "x" * 20_000_000  # a large record, so that a kill often lands mid-write


def _write_job_records_forever(folder: str) -> None:
    for i in range(10**9):
        check_job(Path(folder), {"learning_rate": 1e-3, "padding": PADDING, "i": i})


def test_the_job_record_is_never_half_written(tmp_path):
    """SIGKILL while the record is being written over and over: what is on disk always parses.
    (No checkpoint yet, so each call only writes.)"""
    check_job(tmp_path, {"learning_rate": 1e-3, "padding": PADDING, "i": -1})
    for _ in range(10):
        writer = multiprocessing.get_context("fork").Process(target=_write_job_records_forever, args=(str(tmp_path),))
        writer.start()
        writer.join(0.25)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        record = json.loads((tmp_path / JOB_FILE).read_text())
        assert record["learning_rate"] == 1e-3


def test_a_stop_a_finalizer_swallowed_while_preparing_is_raised_when_training_begins(monkeypatch):
    """StopOnSignal's handler raises before training; if that exception was swallowed (the signal
    landed in a `__del__`), the stop is remembered and raised when training would begin."""
    from byoc.training import stopping
    from byoc.training.checkpoints import StopOnSignal

    monkeypatch.setattr(stopping._signal, "stopped_while", None)
    stop = StopOnSignal()
    try:
        stop._handle(signal.SIGTERM, None)  # what a finalizer would print and forget
    except stopping.Stopped:
        pass
    with pytest.raises(stopping.Stopped, match="while preparing the job"):
        stop.arm("training")
    with pytest.raises(stopping.Stopped, match="while preparing the job"):
        StopOnSignal().install()  # and so does a handler installed after it
