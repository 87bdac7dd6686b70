"""A training whose loss is no longer a number fails the job, instead of publishing a model that
answers NaN with exit code 0.

A learning rate far too high (or an fp16 overflow the loss scaler cannot absorb) turns the weights
into NaN or infinity within a few steps; from then on every loss is NaN, the Trainer carries on to
the end, and the saved model answers NaN to every request. `DivergenceGuard` watches each logged
training loss (the Trainer's NaN filter is off, so a NaN shows instead of being averaged away):
`patience` non-finite logged losses in a row stop training, and `check` fails the job naming the
step and the likely cause, before any evaluation or model is written. A loss that is non-finite in
the last log, or weights that are, fail it too. Every rank sees the same logged loss (the Trainer
averages it across ranks), so every rank stops at the same step.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from byoc.errors import UserError


class TrainingDiverged(UserError, RuntimeError):
    """The loss or the weights are no longer finite numbers: no model is written."""


class DivergenceGuard(TrainerCallback):
    """Stop training after `patience` non-finite logged losses in a row; `check` says why the job fails."""

    def __init__(self, learning_rate: float, patience: int = 3) -> None:
        self.learning_rate = learning_rate
        self.patience = patience
        self.bad_since: int | None = None  # the step of the first non-finite loss of the current run
        self.bad_logs = 0
        self.last_loss: float | None = None
        self.last_step = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs or "train_runtime" in logs:
            return
        self.last_loss, self.last_step = float(logs["loss"]), state.global_step
        if math.isfinite(self.last_loss):
            self.bad_since, self.bad_logs = None, 0
            return
        self.bad_logs += 1
        if self.bad_since is None:
            self.bad_since = state.global_step
        if self.bad_logs >= self.patience:
            control.should_training_stop = True

    def check(self, model: Any) -> None:
        """Raise TrainingDiverged if the last logged loss, or any weight of `model`, is not finite."""
        if self.bad_logs:
            raise TrainingDiverged(
                f"training diverged: the loss was {self.last_loss} at step {self.last_step} (not a number since "
                f"step {self.bad_since}), so no model was written. {self._advice()}"
            )
        broken = next((name for name, p in model.named_parameters() if not bool(p.isfinite().all())), None)
        if broken is not None:
            raise TrainingDiverged(
                f"training diverged: the weights are no longer finite numbers ({broken}, among others, holds "
                f"NaN or infinity) at step {self.last_step}, so no model was written. {self._advice()}"
            )

    def _advice(self) -> str:
        return (
            f"The likely cause is a learning rate too high for this model (learning_rate={self.learning_rate:g}; "
            "2e-5 to 5e-5 suits BERT-family models), or fp16 overflow (train with precision=bf16 or fp32)."
        )
