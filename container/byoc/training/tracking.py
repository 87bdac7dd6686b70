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
ends the tracking (MLflow's retries are shortened to seconds unless the user set theirs). Each call
(the start, a step's metrics, the end) runs on a daemon thread that the job waits on for
BYOC_TRACKING_TIMEOUT seconds at most: a server that answers a byte at a time restarts MLflow's
per-read timeout forever, and would otherwise hold training, and a SIGTERM's exit, with it. MLflow's
own output goes without the URI's password (`_quiet_mlflow`). Without MLFLOW_TRACKING_URI nothing of
MLflow is imported. The run is this process's, like its process group (byoc.launch.distributed):
module state, set by `start`, ended by `finish` or `fail`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from byoc import __version__
from byoc.logs import mask_hyperparameters, mask_text

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

T = TypeVar("T")


class NoAnswer(Exception):
    """A tracking call that overran its deadline (left behind on its daemon thread)."""


def _within(seconds: float, call: Callable[[], T]) -> T:
    """`call()` on a daemon thread, waited for `seconds` at most (NoAnswer after). MLflow's timeout is
    per read, so a server that trickles bytes never trips it; a daemon left waiting on one cannot
    hold the process's exit either (a ThreadPoolExecutor's threads would: they are joined at exit)."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=work, name="byoc-mlflow", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise NoAnswer(f"no answer within {seconds:g} s, BYOC_TRACKING_TIMEOUT")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class Run:
    """One MLflow run through MLflow's client; the first failed call ends the tracking, with a warning."""

    def __init__(self, client: Any, run_id: str, uri: str, timeout: float) -> None:
        self.client, self.run_id, self.uri, self.timeout = client, run_id, uri, timeout
        self.broken = False
        self.step = 0  # the last step logged: the final metrics go there

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        """`client.method(run_id, ...)` within the deadline; the first failure turns tracking off."""
        if self.broken:
            return
        send = getattr(self.client, method)
        try:
            _within(self.timeout, lambda: send(self.run_id, *args, **kwargs))
        except Exception as err:
            self.broken = True
            logger.warning(
                "MLflow at %s failed %s (%s): tracking is off for the rest of this job; training goes on",
                mask_text(self.uri),
                what,
                mask_text(str(err)),
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
    tracking = settings.tracking
    if tracking.mlflow_uri is None or settings.rank.rank != 0:
        return None
    for name, value in QUICK_FAILURE.items():
        os.environ.setdefault(name, value)  # MLflow reads them as it sends
    try:
        _quiet_mlflow(tracking.mlflow_uri)  # here, not on the clock: importing MLflow takes seconds
        run = _within(tracking.timeout, lambda: _create(tracking, contract, args))
    except Exception as err:
        logger.warning(
            "MLflow at %s cannot be reached (%s: %s): this job is not tracked; training goes on",
            mask_text(tracking.mlflow_uri),
            type(err).__name__,
            mask_text(str(err)),
        )
        return None
    logger.info(
        "MLflow: run %s (%s) in experiment %r at %s",
        contract.job_name,
        run.run_id,
        tracking.experiment,
        tracking.mlflow_uri,
    )
    return run


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
    return Run(client, run.info.run_id, tracking.mlflow_uri, tracking.timeout)


def _quiet_mlflow(uri: str) -> None:
    """MLflow's own output without the URI's password (http://user:PASSWORD@host), and without a
    plugin's warning at every request."""
    import mlflow  # noqa: F401  (its import sets up the loggers changed below)

    # As a run ends MLflow prints "View run ... at: <URI>" to stdout, the password and all, past
    # byoc's masking. byoc's own line at the start names the run and the server, masked.
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    # MLflow's loggers write to stderr through a handler of their own, not byoc's: mask it too.
    for handler in logging.getLogger("mlflow").handlers:
        if not isinstance(handler.formatter, _Masking):
            handler.setFormatter(_Masking(handler.formatter))
    if not uri.startswith("arn:"):
        _drop_arn_headers()


class _Masking(logging.Formatter):
    """Another formatter's lines, secrets masked (byoc.logs.mask_text)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return mask_text(self.inner.format(record))


def _drop_arn_headers() -> None:
    """sagemaker-mlflow's request header provider is for a managed server's ARN, yet says it applies
    to every URI: with a URL it fails to parse it as an ARN at every request, and MLflow logs "WARNING
    mlflow.tracking.request_header.registry: ... list index out of range" each time. It has no header
    for a URL, so it leaves MLflow's registry; the other providers, and their warnings, stay."""
    from mlflow.tracking.request_header import registry  # only with a run: MLflow is loaded by now

    providers = getattr(registry._request_header_provider_registry, "_registry", None)
    if isinstance(providers, list):  # MLflow's private list: left alone if that changes
        providers[:] = [p for p in providers if not type(p).__module__.startswith("sagemaker_mlflow")]


def params_of(args: Any) -> dict[str, Any]:
    """The resolved hyperparameters (every TrainArguments field, defaults included), secrets masked."""
    return mask_hyperparameters({key: value for key, value in args.as_dict().items() if value is not None})


def finish(run: Run | None, metrics: Any) -> None:
    """The final metrics (those of metrics.json), and the run FINISHED."""
    if run is None:
        return
    if isinstance(metrics, dict):
        run.log_metrics({f"final_{key}": value for key, value in metrics.items()}, step=run.step)
    run.call("to end the run", "set_terminated", status="FINISHED")


def fail(run: Run | None, message: str) -> None:
    """The run FAILED, with the failure's message (what output/failure holds)."""
    if run is None:
        return
    run.call("to record the failure", "set_tag", "byoc.failure", message[:5000])
    run.call("to end the run", "set_terminated", status="FAILED")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _millis() -> int:
    return int(time.time() * 1000)
