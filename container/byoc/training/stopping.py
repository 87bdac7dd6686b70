"""`Stopped`: the job stopped on SIGTERM. Its own module, free of heavy imports, so that the
SIGTERM handler installed first thing in `byoc train` can raise it at any moment, even while
torch and transformers are still being imported.

A signal handler runs wherever the main thread is, and that can be inside a finalizer (a
`__del__`, a weakref callback): Python prints an exception raised there as "Exception ignored"
and carries on, so the stop would be lost and the job would train to the end. `stop` therefore
also remembers the request; `raise_if_stopped` raises it again at the next checkpoint of the
start-up, and `guard_finalizers` sends the signal again when it was swallowed, so the stop stays prompt.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

logger = logging.getLogger(__name__)

RESEND_AFTER_S = 0.05


@dataclass
class _Signal:
    """What this process knows of SIGTERM. A signal is the process's, as its handler is: one per process."""

    stopped_while: str | None = None  # the phase a SIGTERM came in, once one did before training
    previous_hook: Any = None  # sys.unraisablehook before guard_finalizers replaced it


_signal = _Signal()


class Stopped(BaseException):
    """The job stopped on SIGTERM (after saving a checkpoint, once training had started).

    A BaseException, like KeyboardInterrupt: raised from the signal handler wherever the job is,
    it must not be caught and reworded by the `except Exception` of the step it interrupts.
    """

    def __init__(
        self, step: int | None, max_steps: int = 0, checkpoint_dir: Path | None = None, phase: str = "training"
    ) -> None:
        if step is None:
            text = (
                f"stopped by SIGTERM while {phase}, before the first training step: nothing was lost; "
                "run the job again to start it"
            )
        else:
            text = (
                f"stopped by SIGTERM at step {step} of {max_steps} ({phase}); checkpoint saved in {checkpoint_dir}: "
                "run the job again with the same checkpoint location (checkpoint_s3_uri) and it resumes from there"
            )
        super().__init__(text)
        self.step = step


def stop(phase: str) -> NoReturn:
    """From a SIGTERM handler before training starts: remember the stop, then raise `Stopped`."""
    if _signal.stopped_while is None:
        _signal.stopped_while = phase
    raise Stopped(None, phase=_signal.stopped_while)


def raise_if_stopped() -> None:
    """Raise `Stopped` for a SIGTERM that came earlier but whose exception a finalizer swallowed."""
    if _signal.stopped_while is not None:
        raise Stopped(None, phase=_signal.stopped_while)


def guard_finalizers() -> None:
    """Send SIGTERM again when its `Stopped` was swallowed by a finalizer (sys.unraisablehook)."""
    if _signal.previous_hook is None:
        _signal.previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _unraisable(info: Any) -> None:
    if not isinstance(info.exc_value, Stopped):
        _signal.previous_hook(info)
        return
    # Not from this hook (an exception here would be swallowed too) but a moment later, from a
    # thread: the handler then runs in the main thread's own code, where raising stops the job.
    logger.info("SIGTERM came while Python ran a finalizer, which cannot stop the job: delivering it again")
    resend = threading.Timer(RESEND_AFTER_S, os.kill, (os.getpid(), signal.SIGTERM))
    resend.daemon = True
    resend.start()
