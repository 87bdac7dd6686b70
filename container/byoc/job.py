"""`byoc.job`: the training job's steps, at the path copies of `code/train.py` made before the
package had rooms import them from. They live in byoc.training.job; this module only re-exports them."""

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
