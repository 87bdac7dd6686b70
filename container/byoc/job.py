"""`byoc.job`, public API: the training job's steps, which a copy of `code/train.py` composes
(`prepare`, `load_model`, `make_trainer`, `train_and_evaluate`, `finish`, under `stop_on_sigterm`).
They live in byoc.training.job; this module re-exports them, the same objects, by name. Import it
inside `main`, after `run_job` has set the device's environment: it loads transformers."""

from byoc.training.job import (
    Job,
    finish,
    load_model,
    make_trainer,
    prepare,
    stop_on_sigterm,
    train_and_evaluate,
)

__all__ = [
    "Job",
    "prepare",
    "load_model",
    "make_trainer",
    "train_and_evaluate",
    "finish",
    "stop_on_sigterm",
]
