"""What a failure means to the job: the user errors (the message says what to change), what an
out-of-memory error says, and the exit codes. Only the standard library is imported: the failure
path must work even when a SIGTERM cut an import of torch or transformers short.

A `UserError` subclass is a mistake in the job's input or settings: `byoc train` writes its
message to `output/failure` as it is, without a traceback. Anything else is reported as an
unexpected error, with the traceback in the log. `byoc.training.stopping.Stopped` (SIGTERM) is the
other expected ending.
"""

from __future__ import annotations

import sys
import traceback

EXIT_FAILURE = 1
EXIT_STOPPED = 128 + 15  # as if killed by SIGTERM, after saving a checkpoint


class UserError(Exception):
    """Base of every error whose message tells the user what to change (HyperparameterError,
    ContractError, DataError, ModelError, HandlerError, CheckpointMismatch, and their subclasses)."""


def brief(err: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to `limit` characters: for user messages, which
    carry no traceback."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(err: BaseException) -> str:
    """What went wrong, for a user: a `UserError`'s own message, where memory ran out, or a summary."""
    if isinstance(err, UserError):
        return str(err)
    if is_out_of_memory(err):
        return out_of_memory_message(err)
    return f"unexpected error: {type(err).__name__}: {err} (the full traceback is in the job's log)"


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError):
        return True
    torch = sys.modules.get("torch")  # never imported here (see above)
    if torch is not None and isinstance(err, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(err).lower()  # CPU allocator: "not enough memory"; CUDA/XLA: "out of memory"
    return isinstance(err, RuntimeError) and ("out of memory" in text or "not enough memory" in text)


_EVAL_BATCH = "lower per_device_eval_batch_size or max_length, or use an instance with more memory"
_EVAL_DATA = "lower max_eval_samples, or use an instance with more memory"
# Where memory ran out, by the innermost of these functions on the traceback (the Trainer's names, the
# same in transformers 4.55-5.x), and what helps there: the training batch size only helps in training.
_OUT_OF_MEMORY_IN = {
    "classification_metrics": ("while computing the evaluation metrics", _EVAL_DATA),
    "multilabel_metrics": ("while computing the evaluation metrics", _EVAL_DATA),
    "regression_metrics": ("while computing the evaluation metrics", _EVAL_DATA),
    "compute_metrics": ("while computing the evaluation metrics", _EVAL_DATA),
    "prediction_step": ("in an evaluation step", _EVAL_BATCH),
    "evaluation_loop": ("while evaluating (the predictions of every eval row are kept)", _EVAL_DATA),
    "training_step": ("in a training step", None),
    "_inner_training_loop": ("while training", None),
}
_TRAIN_BATCH = (
    "lower per_device_train_batch_size or max_length (or raise gradient_accumulation_steps to keep the "
    "effective batch), or use an instance with more memory"
)


def out_of_memory_message(err: BaseException) -> str:
    """Out of memory: where (training step, evaluation, or the byoc function outside both) and what to change."""
    frames = [
        (frame.f_code.co_name, frame.f_globals.get("__name__", "")) for frame, _ in traceback.walk_tb(err.__traceback__)
    ]
    for function, _ in reversed(frames):
        if function in _OUT_OF_MEMORY_IN:
            where, advice = _OUT_OF_MEMORY_IN[function]
            return f"out of memory {where}: {advice or _TRAIN_BATCH}"
    ours = [f"{module}.{function}" for function, module in frames if module.split(".")[0] == "byoc"]
    where = f"in {ours[-1]}" if ours else "outside the training steps"
    return (
        f"out of memory {where}, not in a training step (so a smaller batch does not help): use an instance with "
        "more memory, or less data; the traceback in the job's log shows what was being allocated"
    )
