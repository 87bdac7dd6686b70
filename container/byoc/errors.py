"""What a failure means to the job: the user errors (the message says what to change) and the exit
codes. No imports: the failure path must work even when a SIGTERM cut an import of torch or
transformers short.

A `UserError` subclass is a mistake in the job's input or settings: `byoc train` writes its
message to `output/failure` as it is, without a traceback. Anything else is reported as an
unexpected error, with the traceback in the log. `byoc.interruption.Interrupted` (SIGTERM) is the
other expected ending.
"""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 128 + 15  # as if killed by SIGTERM, after saving a checkpoint


class UserError(Exception):
    """Base of every error whose message tells the user what to change (HyperparameterError,
    ContractError, DataError, ModelError, HandlerError, CheckpointMismatch, and their subclasses)."""


def brief(err: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to `limit` characters: for user messages, which
    carry no traceback."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
