"""`Interrupted`: the job stopped on SIGTERM. Its own module, free of heavy imports, so that the
SIGTERM handler installed first thing in `byoc train` can raise it at any moment, even while
torch and transformers are still being imported."""

from __future__ import annotations

from pathlib import Path


class Interrupted(BaseException):
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
