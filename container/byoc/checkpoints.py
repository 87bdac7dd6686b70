"""Checkpoints that survive a stop or a spot interruption: save on SIGTERM, resume on restart.

SageMaker stops a job (and takes back a spot instance) with SIGTERM to the container, then
SIGKILL 120 s later; it restores `/opt/ml/checkpoints` from `checkpoint_s3_uri` when the job
starts again. So: on SIGTERM the job finishes its current step, saves a Trainer checkpoint
(model, optimizer, scheduler, RNG states, step) and exits non-zero with a failure message saying
it will resume; at start, the newest complete checkpoint is resumed from at its exact step.
A checkpoint folder written by a different configuration is refused with the difference named,
instead of silently mixing two jobs.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger("byoc.checkpoints")

JOB_FILE = "byoc-job.json"
# A Trainer checkpoint is complete once these exist (trainer_state.json is written last).
REQUIRED = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


class Interrupted(Exception):
    """The job stopped on SIGTERM after saving a checkpoint."""

    def __init__(self, step: int, max_steps: int, checkpoint_dir: Path) -> None:
        super().__init__(
            f"stopped by SIGTERM at step {step} of {max_steps}; checkpoint saved in {checkpoint_dir}: "
            "run the job again with the same checkpoint location (checkpoint_s3_uri) and it resumes from there"
        )
        self.step = step


class CheckpointMismatch(ValueError):
    """The checkpoint folder holds another configuration's checkpoints."""


class StopOnSignal(TrainerCallback):
    """SIGTERM sets a flag; at the end of the current step the Trainer saves and stops."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.stopped_at: int | None = None
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        logger.warning("SIGTERM received: saving a checkpoint at the end of this step, then stopping")
        self.requested.set()

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested.is_set():
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control


def newest_complete(checkpoint_dir: Path) -> Path | None:
    """The newest `checkpoint-N` folder with every file a resume needs; half-written ones are skipped."""
    if not checkpoint_dir.is_dir():
        return None
    found = []
    for path in checkpoint_dir.glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if not match or not path.is_dir():
            continue
        weights = any((path / name).exists() for name in ("model.safetensors", "model.safetensors.index.json"))
        if weights and all((path / name).exists() for name in REQUIRED):
            found.append((int(match.group(1)), path))
        else:
            logger.warning("ignoring incomplete checkpoint %s (killed while it was written?)", path)
    return max(found)[1] if found else None


def check_job(checkpoint_dir: Path, job: dict[str, Any]) -> None:
    """Record this job's configuration beside its checkpoints, or refuse checkpoints of another one."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / JOB_FILE
    if path.exists() and newest_complete(checkpoint_dir) is not None:
        previous = json.loads(path.read_text())
        changed = [f"{key} {previous.get(key)!r} -> {job.get(key)!r}"
                   for key in sorted(set(previous) | set(job)) if previous.get(key) != job.get(key)]
        if changed:
            raise CheckpointMismatch(
                f"the checkpoints in {checkpoint_dir} come from a different job configuration ({'; '.join(changed[:5])}): "
                "delete them or use a new checkpoint location to start over, or restore the configuration to resume"
            )
    path.write_text(json.dumps(job, indent=2, sort_keys=True))
