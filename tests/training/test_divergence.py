"""A diverged training fails the job: `learning_rate=1e300` gave NaN loss and NaN weights, exit code
0 and a model.tar.gz that answered NaN. Now the job fails naming the step and the likely cause, and
writes no model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from byoc.training.divergence import DivergenceGuard, TrainingDiverged
from helpers import SMALL_JOB_HP, build_job, run_train_process

NAN, INF = math.nan, math.inf


def _logged(guard: DivergenceGuard, *losses: float) -> SimpleNamespace:
    """Feed `losses` as the logged training losses of steps 10, 20, ...; the control the last one left."""
    control = SimpleNamespace(should_training_stop=False)
    for i, loss in enumerate(losses, start=1):
        guard.on_log(None, SimpleNamespace(global_step=10 * i), control, logs={"loss": loss, "learning_rate": 1.0})
    return control


def _model(broken: bool = False) -> torch.nn.Module:
    model = torch.nn.Linear(2, 2)
    if broken:
        with torch.no_grad():
            model.bias[0] = NAN
    return model


def test_three_non_finite_losses_in_a_row_stop_training_and_fail_the_job():
    guard = DivergenceGuard(learning_rate=1e300)
    assert not _logged(guard, 0.7, NAN, INF).should_training_stop
    guard = DivergenceGuard(learning_rate=1e300)
    assert _logged(guard, 0.7, NAN, INF, NAN).should_training_stop
    with pytest.raises(TrainingDiverged, match=r"the loss was nan at step 40 \(not a number since step 20\)") as err:
        guard.check(_model())
    assert "learning_rate=1e+300" in str(err.value) and "no model was written" in str(err.value)


def test_a_loss_that_recovers_is_no_divergence():
    """One overflowing interval (fp16's loss scaler skips such steps) between finite ones is not."""
    guard = DivergenceGuard(learning_rate=5e-5)
    assert not _logged(guard, 0.7, INF, NAN, 0.6, NAN, 0.5).should_training_stop
    guard.check(_model())  # nothing raised


def test_a_loss_not_finite_at_the_end_fails_the_job():
    guard = DivergenceGuard(learning_rate=5e-5)
    _logged(guard, 0.7, 0.6, NAN)
    with pytest.raises(TrainingDiverged, match="at step 30"):
        guard.check(_model())


def test_weights_that_are_not_finite_fail_the_job_whatever_the_loss_said():
    guard = DivergenceGuard(learning_rate=5e-5)
    _logged(guard, 0.7, 0.6)
    with pytest.raises(TrainingDiverged, match=r"\(bias, among others, holds NaN or infinity\) at step 20"):
        guard.check(_model(broken=True))
    guard.check(_model())  # finite weights, finite loss: nothing raised


def test_losses_the_guard_does_not_judge():
    """Evaluation logs and the final training summary carry no step loss to judge."""
    guard = DivergenceGuard(learning_rate=5e-5)
    control = SimpleNamespace(should_training_stop=False)
    for logs in ({"eval_loss": NAN}, {"loss": NAN, "train_runtime": 3.0}, None, {}):
        guard.on_log(None, SimpleNamespace(global_step=10), control, logs=logs)
    assert not control.should_training_stop
    guard.check(_model())


@pytest.mark.integration
def test_byoc_train_with_a_huge_learning_rate_fails_and_publishes_nothing(tmp_path, tiny_model_dir):
    hps = {**SMALL_JOB_HP, "learning_rate": "1e300", "max_steps": "400", "logging_steps": "5"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, hps, test=16)
    done = run_train_process(job.root, env={"CUDA_VISIBLE_DEVICES": ""})
    log = done.stdout + done.stderr
    assert done.returncode == 1, log[-3000:]
    assert job.failure.startswith("training diverged: the loss was nan at step "), job.failure
    assert "learning_rate=1e+300" in job.failure and "no model was written" in job.failure
    step = int(job.failure.split("at step ")[1].split()[0])
    assert step < 400  # stopped once it was clear, not trained to the end
    assert not job.model_dir.exists() or not any(job.model_dir.iterdir()), sorted(job.model_dir.iterdir())
    assert "Traceback" not in log  # a user error: its message, not a stack trace
