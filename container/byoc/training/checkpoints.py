"""Checkpoints that survive a stop or a spot interruption: save on SIGTERM, resume on restart.

SageMaker stops a job (and takes back a spot instance) with SIGTERM to the container, then
SIGKILL 120 s later; it restores `/opt/ml/checkpoints` from `checkpoint_s3_uri` when the job
starts again. So: on SIGTERM the job finishes its current step (or cuts an evaluation short),
saves a Trainer checkpoint (model, optimizer, scheduler, RNG states of every rank, step) and
exits 143 with a failure message saying it will resume; at start, the newest complete checkpoint
is resumed from at its exact step. Every rank takes the stop decision together (one tiny
all-reduce per step), so they all stop at the same step.

A checkpoint counts only once every rank has finished writing it and rank 0 has written
`byoc-complete.json` (file names and sizes) into it: a folder killed mid-write is never loaded,
and older checkpoints are rotated away only after the new one is complete.
A checkpoint folder written by a different configuration is refused with the difference named,
instead of silently mixing two jobs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import signal
import threading
import zipfile
from pathlib import Path
from typing import Any

from safetensors import safe_open
from transformers import TrainerCallback, TrainerState

from byoc.errors import UserError, brief
from byoc.launch import distributed
from byoc.safe_files import write_atomically
from byoc.training import stopping  # Stopped lives where importing it is cheap (see that module)

logger = logging.getLogger(__name__)

JOB_FILE = "byoc-job.json"
MARKER = "byoc-complete.json"
REQUIRED = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


class EvaluationStopped(Exception):
    """Raised inside an evaluation loop on SIGTERM, so the checkpoint is saved without waiting for it."""


class CheckpointMismatch(UserError, ValueError):
    """The checkpoint folder holds another configuration's checkpoints."""


class StopOnSignal(TrainerCallback):
    """What SIGTERM does, by phase.

    Before training starts (data, tokenizing, model loading) it raises `Stopped` at once:
    there is nothing to save. Once training runs (`arm`) it only sets a flag: at the end of the
    current step, or at the next batch of an evaluation, every rank saves and stops together.
    After training the job arms it again for the final evaluation, which is cut short the same way,
    and then for the test predictions (phase "writing predictions"), which are not cut short: they
    are seconds from the end, so the job finishes them.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.stopped_at: int | None = None
        self.evaluation_stopped = False
        self.phase = "preparing the job (reading data, tokenizing, loading the model)"
        self._armed = False
        self._previous: Any = None

    def install(self) -> None:
        stopping.raise_if_stopped()  # one that came before, and that a finalizer swallowed
        if threading.current_thread() is threading.main_thread():
            stopping.guard_finalizers()
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def arm(self, phase: str = "training") -> None:
        stopping.raise_if_stopped()  # a SIGTERM a finalizer swallowed while preparing
        self._armed, self.phase = True, phase

    def _handle(self, signum, frame) -> None:
        if not self._armed:
            stopping.stop(self.phase)
        first = not self.requested.is_set()
        self.requested.set()
        if first:
            logger.warning("SIGTERM received: saving a checkpoint at the end of this step, then stopping")

    def stop_now(self) -> bool:
        return distributed.any_rank(self.requested.is_set())  # every rank decides the same

    def on_train_begin(self, args, state, control, **kwargs):
        self.arm("training")

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_now():
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.phase != "writing predictions" and self.stop_now():
            self.evaluation_stopped = True
            self.stopped_at = state.global_step
            raise EvaluationStopped()


def _checkpoints(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in checkpoint_dir.glob("checkpoint-*") if checkpoint_dir.is_dir() else ():
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def mark_complete(folder: Path, ranks: list[int] | None = None) -> None:
    """Seal a checkpoint every rank has finished writing: record its files and their sizes.

    `ranks`: the ranks whose RNG state this host holds (None: a single-process job). Each host
    keeps a full copy of its checkpoints, with the RNG states of its own ranks.
    """
    expected = list(REQUIRED) + (["rng_state.pth"] if ranks is None else [f"rng_state_{r}.pth" for r in ranks])
    missing = [name for name in expected if not (folder / name).exists()]
    if missing or not any((folder / n).exists() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise RuntimeError(f"checkpoint {folder} is missing {', '.join(missing) or 'its weights'} after saving")
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}
    write_atomically(folder / MARKER, json.dumps({"files": files}))


def is_complete(folder: Path) -> bool:
    """Sealed by `mark_complete`, and every file still has the size it had then."""
    try:
        files = json.loads((folder / MARKER).read_text())["files"]
        return bool(files) and all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def newest_complete(checkpoint_dir: Path) -> Path | None:
    """The newest sealed `checkpoint-N` folder; half-written ones are skipped (and said so)."""
    for _, path in reversed(_checkpoints(checkpoint_dir)):
        if is_complete(path):
            return path
        logger.warning("ignoring incomplete checkpoint %s (killed while it was written?)", path)
    return None


def unreadable(folder: Path) -> str | None:
    """Why a sealed checkpoint cannot be loaded (None: it can): a file overwritten in place keeps its
    size, so the seal alone does not catch it. Reads the state and the weights' header, and checks
    every torch file's CRCs (optimizer, scheduler, RNG states)."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
        if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
            return "trainer_state.json has no global_step"
        if (problem := state_problem(state)) is not None:
            return f"trainer_state.json: {problem}"
        _check_weights(folder)
        for path in sorted(folder.iterdir()):
            if path.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(path) as archive:
                    if (bad := archive.testzip()) is not None:
                        return f"{path.name} is corrupted ({bad})"
    except Exception as err:  # whatever a damaged file raises: the checkpoint is skipped, not the job
        return brief(err, 200)
    return None


_NUMBER, _NONE = (int, float), type(None)
# What the Trainer's resume reads of trainer_state.json, and the JSON types it can take: valid JSON of
# other types was resumed, and the job died in the Trainer with "unexpected error: TypeError".
STATE_TYPES: dict[str, tuple[type, ...]] = {
    "epoch": _NUMBER,
    "global_step": (int,),
    "max_steps": (int,),
    "logging_steps": _NUMBER,
    "eval_steps": _NUMBER,
    "save_steps": _NUMBER,
    "train_batch_size": (int, _NONE),
    "num_train_epochs": _NUMBER,
    "num_input_tokens_seen": _NUMBER,
    "total_flos": _NUMBER,
    "log_history": (list,),
    "best_metric": (*_NUMBER, _NONE),
    "best_global_step": (int, _NONE),
    "best_model_checkpoint": (str, _NONE),
    "is_local_process_zero": (bool,),
    "is_world_process_zero": (bool,),
    "is_hyper_param_search": (bool,),
    "trial_name": (str, _NONE),
    "trial_params": (dict, _NONE),
    "stateful_callbacks": (dict, _NONE),
}


def state_problem(state: dict[str, Any]) -> str | None:
    """Why the Trainer could not resume from this trainer_state.json content (None: it can): a field
    this transformers' TrainerState does not know, or a value of the wrong JSON type."""
    known = {field.name for field in dataclasses.fields(TrainerState)}
    if unknown := sorted(set(state) - known):
        return f"{', '.join(unknown)}: not a field of this transformers' TrainerState"
    for name, value in state.items():
        types = STATE_TYPES.get(name)
        if types is None:
            continue
        if isinstance(value, bool) and bool not in types:  # JSON true is no step count
            types = ()
        if not isinstance(value, types):
            return f"{name} is {json.dumps(value)[:40]}, not {' or '.join(t.__name__ for t in types) or 'a number'}"
    if not all(isinstance(entry, dict) for entry in state.get("log_history") or []):
        return "log_history holds an entry that is not an object"
    return None


def _check_weights(folder: Path) -> None:
    index = folder / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else []
    for name in shards or ["model.safetensors"]:
        with safe_open(str(folder / name), framework="pt") as weights:
            weights.keys()


def usable(folder: Path) -> bool:
    """Sealed, and loadable; says why a sealed one is not."""
    if not is_complete(folder):
        return False
    reason = unreadable(folder)
    if reason is not None:
        logger.warning("skipping the checkpoint %s: it was sealed but cannot be loaded (%s)", folder, reason)
    return reason is None


def common_resume_point(checkpoint_dir: Path) -> Path | None:
    """The newest checkpoint usable on every host (each host reads its own copy)."""
    steps = {step for step, path in _checkpoints(checkpoint_dir) if usable(path)}
    everywhere = set.intersection(*[set(s) for s in distributed.all_gather(sorted(steps))])
    if not everywhere:
        newest_complete(checkpoint_dir)  # says which folders it ignored
        return None
    return checkpoint_dir / f"checkpoint-{max(everywhere)}"


def rotate(checkpoint_dir: Path, keep: int | None) -> None:
    """Keep the newest `keep` complete checkpoints (all if None); drop the rest below the newest."""
    found = _checkpoints(checkpoint_dir)
    complete = [step for step, path in found if is_complete(path)]
    if not complete:
        return
    kept = set(complete[-keep:] if keep else complete)
    for step, path in found:
        if step not in kept and step < complete[-1]:
            shutil.rmtree(path, ignore_errors=True)


def drop_after(checkpoint_dir: Path, resume: Path | None) -> None:
    """Every checkpoint newer than the one resumed from (half-written, unloadable, or missing on another
    host): the resumed run writes them again, into empty folders, so a stale seal never vouches for a
    half-rewritten one."""
    start = int(resume.name.split("-")[1]) if resume else -1
    for step, path in _checkpoints(checkpoint_dir):
        if step > start:
            logger.info("removing the checkpoint %s, newer than the one resumed from: training writes it again", path)
            shutil.rmtree(path, ignore_errors=True)


def check_job(checkpoint_dir: Path, job: dict[str, Any]) -> None:
    """Record this job's configuration beside its checkpoints, or refuse checkpoints of another one."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / JOB_FILE
    if path.exists() and newest_complete(checkpoint_dir) is not None:
        try:
            previous = json.loads(path.read_text())
            if not isinstance(previous, dict):
                raise ValueError(f"a JSON {type(previous).__name__}, not an object")
        except (OSError, ValueError) as err:  # not written by this version of byoc (its write is atomic)
            raise CheckpointMismatch(
                f"cannot tell which job configuration the checkpoints in {checkpoint_dir} come from: {path.name} is "
                f"unreadable ({brief(err, 120)}). Delete {path} to resume from them anyway, or delete the "
                "checkpoints (or use a new checkpoint location) to start over"
            ) from None
        changed = [
            f"{key} {previous.get(key)!r} -> {job.get(key)!r}"
            for key in sorted(set(previous) | set(job))
            if previous.get(key) != job.get(key)
        ]
        if changed:
            raise CheckpointMismatch(
                f"the checkpoints in {checkpoint_dir} come from a different job configuration "
                f"({'; '.join(changed[:5])}): "
                "delete them or use a new checkpoint location to start over, or restore the configuration to resume"
            )
    write_atomically(path, json.dumps(job, indent=2, sort_keys=True))
