"""The final evaluation, and what its failure costs: never the trained model.

Training can take hours; the evaluation after it takes seconds and is the likelier to meet what
the training did not (metrics over 100,000 labels, a test set larger than the eval set). So a
failure there, or in the test predictions, is kept (its traceback logged at once): `finish` still
writes metrics.json and publishes the model, then fails the job with `EvaluationFailed`, which
says that the model was saved and why the evaluation failed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from transformers import PreTrainedModel, Trainer

from byoc import model_folder
from byoc.errors import UserError, describe
from byoc.launch import distributed
from byoc.training.arguments import TrainArguments
from byoc.training.metrics import TaskMetrics

logger = logging.getLogger(__name__)


class EvaluationFailed(UserError):
    """Training finished and the model was saved, but the final evaluation (or the test predictions) failed."""


def final_evaluation(trainer: Trainer, tokenized: dict[str, Any], args: TrainArguments) -> dict[str, Any]:
    """Eval metrics on the eval split (else test), and test metrics when test is a separate split;
    with them the per-label figures of a multi-label task (`eval_f1_per_label`), for metrics.json.
    A multi-label model gets the thresholds chosen on the eval split, if any (`decision_thresholds`)."""
    metrics: dict[str, Any] = {}
    if not args.do_eval:
        return metrics
    eval_ds = tokenized.get("eval", tokenized.get("test"))
    if eval_ds is not None:
        last = [h for h in trainer.state.log_history if "eval_loss" in h and h.get("step") == trainer.state.global_step]
        metrics.update(
            {k: v for k, v in last[-1].items() if k.startswith("eval_")}
            if last and not _must_choose(trainer)
            else trainer.evaluate(eval_ds, metric_key_prefix="eval")
        )
        metrics.update(_details(trainer, "eval"))
        metrics.update(_keep_thresholds(trainer))
    if "eval" in tokenized and "test" in tokenized:
        metrics.update(trainer.evaluate(tokenized["test"], metric_key_prefix="test"))
        metrics.update(_details(trainer, "test"))
    return metrics


def _must_choose(trainer: Trainer) -> bool:
    """Whether thresholds are still to be chosen: the last evaluation was another process's (a rerun)."""
    scoring = trainer.compute_metrics
    return isinstance(scoring, TaskMetrics) and scoring.choosing and scoring.tuned is None


def _keep_thresholds(trainer: Trainer) -> dict[str, Any]:
    """The thresholds the final evaluation chose, into the model's config (on every rank: each chose the
    same from the same gathered predictions); later evaluations (test) are scored at them, not choosing."""
    scoring = trainer.compute_metrics
    if not isinstance(scoring, TaskMetrics) or scoring.tuned is None:
        return {}
    scoring.choosing = False
    scoring.tuned.save(cast(PreTrainedModel, trainer.model).config)
    logger.info("decision thresholds chosen on the eval data: %s", scoring.tuned.report())
    return {"decision_thresholds": scoring.tuned.report()}


def decision_thresholds(trainer: Trainer) -> float | list[float]:
    """The multi-label thresholds the model is saved with: one, or one per label (byoc.model_folder)."""
    config = cast(PreTrainedModel, trainer.model).config.to_dict()
    overall, own = model_folder.threshold_of(config), model_folder.thresholds_of(config)
    return overall if own is None else [overall if math.isnan(t) else t for t in own]


def _details(trainer: Trainer, prefix: str) -> dict[str, Any]:
    """The last evaluation's figures kept out of the log lines (byoc.training.metrics.TaskMetrics.details)."""
    details = getattr(trainer.compute_metrics, "details", None) or {}
    return {f"{prefix}_{key}": value for key, value in details.items()}


class Failures:
    """What failed after training, on this rank: the first failure, as a user would read it."""

    def __init__(self) -> None:
        self.first: str | None = None

    @contextmanager
    def kept(self, what: str) -> Iterator[None]:
        """Run the block; an exception in it is logged and kept instead of ending the job."""
        try:
            yield
        except Exception as err:  # SIGTERM (Stopped) is a BaseException: it still stops the job
            logger.exception("%s failed; the trained model will be saved all the same", what)
            self.first = self.first or f"{what} failed: {describe(err)}"

    def agreed(self) -> str | None:
        """The first failure of any rank, on every rank (they then skip the test predictions together)."""
        self.first = next((f for f in distributed.all_gather(self.first) if f), None)
        return self.first

    def raise_after_saving(self, model_dir: Path | None) -> None:
        """Fail the job if anything failed; `model_dir`: where the model was saved (None: no model, as
        in a precompile run)."""
        if self.first is None:
            return
        if model_dir is None:
            raise EvaluationFailed(f"{self.first[0].upper()}{self.first[1:]}")
        raise EvaluationFailed(
            f"training finished and the model was saved to {model_dir}, but {self.first}. The model is "
            "complete; metrics.json holds what was measured before the failure. Fix the cause to evaluate it, or "
            "set do_eval=false (and do_predict=false) to skip the evaluation"
        )
