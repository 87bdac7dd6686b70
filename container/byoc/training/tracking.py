"""The job's run in MLflow, where MLFLOW_TRACKING_URI is set (a URL, or a SageMaker managed MLflow ARN,
which the sagemaker-mlflow plugin in the image resolves).

One run per job, on rank 0 only (the other ranks and hosts log nothing), named after the training
job, in MLFLOW_EXPERIMENT_NAME (default `byoc`): the resolved hyperparameters as params (a secret's
value masked), every logging step's loss, learning rate and samples/s and every evaluation's metrics
(what TensorBoard gets too, from the same `logs`), the final metrics (metrics.json's), tags for the
job, the image and the instance type; the run ends FINISHED, or FAILED with the failure's message
in the `byoc.failure` tag. `byoc.training.entry.run_job` starts and ends it; the Trainer's
`byoc.training.trainer.TrackedLogs` logs the steps in between. Free of transformers and torch:
`run_job` starts the run before the device's environment lets them load.

A tracking server that cannot be reached costs a warning, never the job: the first failed call
ends the tracking (MLflow's retries are shortened to seconds unless the user set theirs). Without
MLFLOW_TRACKING_URI nothing of MLflow is imported. The run is this process's, like its process
group (byoc.launch.distributed): module state, set by `start`, ended by `finish` or `fail`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from typing import Any

from byoc import __version__
from byoc.logs import mask_hyperparameters

logger = logging.getLogger(__name__)

# MLflow retries a failed request 7 times with a growing back-off, minutes before it gives up: an
# unreachable server would hold the job that long at each call. Seconds instead, unless the user chose.
QUICK_FAILURE = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
MAX_PARAM = 500  # characters of a param's value that every MLflow version keeps
BATCH = 100  # params per log_batch call (MLflow's limit)

_run: Run | None = None


class Run:
    """One MLflow run through MLflow's client; the first failed call ends the tracking, with a warning."""

    def __init__(self, client: Any, run_id: str, uri: str) -> None:
        self.client, self.run_id, self.uri = client, run_id, uri
        self.broken = False
        self.step = 0  # the last step logged: the final metrics go there

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        if self.broken:
            return
        try:
            getattr(self.client, method)(self.run_id, *args, **kwargs)
        except Exception as err:
            self.broken = True
            logger.warning(
                "MLflow at %s failed %s (%s): the run stops being tracked; training goes on", self.uri, what, err
            )

    def log_metrics(self, values: dict[str, Any], step: int) -> None:
        # Only here, where a run exists: nothing of MLflow is imported without MLFLOW_TRACKING_URI.
        from mlflow.entities import Metric

        now, self.step = _millis(), max(self.step, step)
        metrics = [Metric(key, float(v), now, step) for key, v in values.items() if _number(v)]
        if metrics:
            self.call("to log metrics", "log_batch", metrics=metrics)


def start(settings: Any, contract: Any, args: Any) -> Run | None:
    """Start this job's run (rank 0, with MLFLOW_TRACKING_URI set); None where there is none or it
    cannot be reached (a warning says why)."""
    global _run
    tracking = settings.tracking
    if tracking.mlflow_uri is None or settings.rank.rank != 0:
        return None
    for name, value in QUICK_FAILURE.items():
        os.environ.setdefault(name, value)  # MLflow reads them as it sends
    try:
        _run = _create(tracking, contract, args)
    except Exception as err:
        logger.warning(
            "MLflow at %s cannot be reached (%s: %s): this job is not tracked; training goes on",
            tracking.mlflow_uri,
            type(err).__name__,
            err,
        )
        return None
    logger.info(
        "MLflow: run %s (%s) in experiment %r at %s",
        contract.job_name,
        _run.run_id,
        tracking.experiment,
        tracking.mlflow_uri,
    )
    return _run


def _create(tracking: Any, contract: Any, args: Any) -> Run:
    # Only with MLFLOW_TRACKING_URI set: importing mlflow costs a second and is never needed otherwise.
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.mlflow_uri)
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        try:
            experiment_id = client.create_experiment(tracking.experiment)
        except MlflowException:  # another job made it meanwhile
            made = client.get_experiment_by_name(tracking.experiment)
            if made is None:
                raise
            experiment_id = made.experiment_id
    tags = {
        "sagemaker.training_job": contract.job_name,
        "sagemaker.instance_type": contract.instance_type,
        "sagemaker.hosts": str(len(contract.hosts)),
        "byoc.version": __version__,
        "byoc.image": tracking.image or "unknown (set BYOC_IMAGE; build_and_push.sh builds it in)",
    }
    run = client.create_run(experiment_id, tags=tags, run_name=contract.job_name)
    params = [Param(key, str(value)[:MAX_PARAM]) for key, value in sorted(params_of(args).items())]
    for i in range(0, len(params), BATCH):
        client.log_batch(run.info.run_id, params=params[i : i + BATCH])
    return Run(client, run.info.run_id, tracking.mlflow_uri)


def params_of(args: Any) -> dict[str, Any]:
    """The resolved hyperparameters (every TrainArguments field, defaults included), secrets masked."""
    return mask_hyperparameters({key: value for key, value in asdict(args).items() if value is not None})


def current() -> Run | None:
    """This job's run, where one was started (rank 0 with MLFLOW_TRACKING_URI set)."""
    return _run


def finish(metrics: Any) -> None:
    """The final metrics (those of metrics.json), and the run FINISHED."""
    global _run
    run, _run = _run, None
    if run is None:
        return
    if isinstance(metrics, dict):
        run.log_metrics({f"final_{key}": value for key, value in metrics.items()}, step=run.step)
    run.call("to end the run", "set_terminated", status="FINISHED")


def fail(message: str) -> None:
    """The run FAILED, with the failure's message (what output/failure holds)."""
    global _run
    run, _run = _run, None
    if run is None:
        return
    run.call("to record the failure", "set_tag", "byoc.failure", message[:5000])
    run.call("to end the run", "set_terminated", status="FAILED")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _millis() -> int:
    return int(time.time() * 1000)
