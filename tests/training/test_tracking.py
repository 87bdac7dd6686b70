"""byoc.training.tracking: a job tracked in a real MLflow server (`mlflow server` from .venv-mlflow,
on loopback, SQLite store), read back through MLflow's REST API: one run per job with its params,
its steps, its evaluations and the final metrics of metrics.json, ended FINISHED or FAILED with the
failure; the same step metrics in TensorBoard's events; an unreachable server, or one that trickles,
costing a warning, never the job; the URI's password in nothing the job prints or writes; nothing of
MLflow imported without MLFLOW_TRACKING_URI; only rank 0 tracks."""

from __future__ import annotations

import itertools
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from byoc.environment import SettingError
from byoc.training import tracking
from byoc.training.hyperparameters import parse_hyperparameters
from byoc.training.settings import TRACKING_TIMEOUT_ENV, TrackingSettings, TrainingSettings
from helpers import REPO, build_job, free_port, run_train_process

MLFLOW = REPO / ".venv-mlflow" / "bin" / "mlflow"
# Every tracked job here reaches the server through a URI with a password, which the server ignores
# (it has no auth) and MLflow's client sends as basic auth: none of it may reach the job's output.
PASSWORD = "Tr4ckPa55w0rd"
JOB = {
    "max_steps": "20",
    "logging_steps": "5",
    "eval_strategy": "steps",
    "eval_steps": "10",
    "learning_rate": "5e-3",
    "per_device_train_batch_size": "8",
}


class Mlflow:
    """A real tracking server, read back through its REST API."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret_url = f"http://byoc:{PASSWORD}@127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(MLFLOW),
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--default-artifact-root",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.api = httpx.Client(base_url=self.url + "/api/2.0/mlflow", timeout=60)

    def ready(self) -> bool:
        assert self.proc.poll() is None, "mlflow server exited"
        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def run(self, experiment: str, name: str) -> dict:
        found = self.api.get("/experiments/get-by-name", params={"experiment_name": experiment}).json()
        runs = self.api.post("/runs/search", json={"experiment_ids": [found["experiment"]["experiment_id"]]}).json()
        [run] = [r for r in runs.get("runs", []) if r["info"]["run_name"] == name]
        return run

    def history(self, run: dict, key: str) -> dict[int, float]:
        answer = self.api.get("/metrics/get-history", params={"run_id": run["info"]["run_id"], "metric_key": key})
        return {m["step"]: m["value"] for m in answer.json().get("metrics", [])}


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    if not MLFLOW.exists():
        pytest.fail(f"no MLflow server at {MLFLOW}: `make venv-mlflow` makes it (make test does)")
    from serve_helpers import wait_for

    server = Mlflow(tmp_path_factory.mktemp("mlflow"))
    try:
        wait_for(server.ready, "the MLflow server to answer /health")
        yield server
    finally:
        server.proc.terminate()
        server.proc.wait(30)


def _tracked_env(server: Mlflow, experiment: str, job_name: str) -> dict[str, str]:
    return {
        "MLFLOW_TRACKING_URI": server.secret_url,
        "MLFLOW_EXPERIMENT_NAME": experiment,
        "TRAINING_JOB_NAME": job_name,
        "BYOC_IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/byoc-gpu:test",
    }


def _assert_the_password_stays_secret(done: subprocess.CompletedProcess, tree: Path) -> None:
    """Not in the job's stdout or stderr (CloudWatch's), nor in any file it left under `tree` (its
    /opt/ml: output/, model/, checkpoints/, tensorboard, the failure file; and its cache)."""
    assert "byoc:***@127.0.0.1" in done.stdout  # byoc's own line named the server, masked
    for name, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        assert PASSWORD not in text, f"{name}: " + "\n".join(line for line in text.splitlines() if PASSWORD in line)
    files = [path for path in tree.rglob("*") if path.is_file()]
    assert files and not [path for path in files if PASSWORD.encode() in path.read_bytes()]


@pytest.mark.integration
def test_a_job_is_one_finished_run_with_its_params_steps_evaluations_and_final_metrics(
    mlflow, tiny_model_dir, tmp_path
):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, JOB, train=64, validation=16)
    done = run_train_process(job.root, env=_tracked_env(mlflow, "byoc-tests", "job-finished"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_the_password_stays_secret(done, tmp_path)
    # sagemaker-mlflow's header provider, an ARN's, warned at each request to a URL: not any more.
    assert "request_header" not in done.stdout + done.stderr
    run = mlflow.run("byoc-tests", "job-finished")
    assert run["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["learning_rate"] == "0.005" and params["max_steps"] == "20"
    assert params["per_device_eval_batch_size"]  # a default, resolved: every hyperparameter is there
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["sagemaker.training_job"] == "job-finished" and tags["sagemaker.instance_type"] == "local"
    assert tags["byoc.image"].endswith("/byoc-gpu:test")
    # Every logging step, and every evaluation, at its step.
    assert sorted(mlflow.history(run, "loss")) == [5, 10, 15, 20]
    assert sorted(mlflow.history(run, "samples_per_second")) == [5, 10, 15, 20]
    assert sorted(mlflow.history(run, "learning_rate")) == [5, 10, 15, 20]
    assert sorted(mlflow.history(run, "eval_accuracy")) == [10, 20]
    # The final metrics are metrics.json's, value for value.
    final = {m["key"][len("final_") :]: m["value"] for m in run["data"]["metrics"] if m["key"].startswith("final_")}
    numbers = {k: v for k, v in job.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numbers and final == pytest.approx(numbers)
    assert sorted(mlflow.history(run, "final_train_loss")) == [20]  # at the job's last step
    # TensorBoard got the same step metrics, from the same logs.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(job.root / "output" / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/samples_per_second", "train/learning_rate", "eval/accuracy"} <= scalars


@pytest.mark.integration
def test_a_failed_job_ends_its_run_failed_with_the_failure(mlflow, tiny_model_dir, tmp_path):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**JOB, "text_column": "sentence"})  # the data has "text"
    done = run_train_process(job.root, env=_tracked_env(mlflow, "byoc-tests", "job-failed"))
    assert done.returncode == 1 and "sentence" in job.failure
    _assert_the_password_stays_secret(done, tmp_path)
    run = mlflow.run("byoc-tests", "job-failed")
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert run["info"]["status"] == "FAILED"
    assert tags["byoc.failure"] == job.failure.strip()


@pytest.mark.integration
def test_an_unreachable_tracking_server_costs_a_warning_never_the_job(tiny_model_dir, tmp_path):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**JOB, "max_steps": "5"})
    nobody = f"http://127.0.0.1:{free_port()}"
    done = run_train_process(job.root, env={"MLFLOW_TRACKING_URI": nobody, "TRAINING_JOB_NAME": "job-alone"})
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert f"MLflow at {nobody} cannot be reached" in log and "this job is not tracked; training goes on" in log
    assert (job.model_dir / "model.safetensors").exists()


class Trickle:
    """A tracking server that accepts and answers one byte a second, forever: each byte restarts
    MLflow's per-read timeout. Stops itself after `limit` seconds (a bound, should a job wait it out)."""

    def __init__(self, limit: float = 240) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(time.monotonic() + limit,), daemon=True)
        self.thread.start()

    def _serve(self, until: float) -> None:
        answers: list[tuple[socket.socket, itertools.chain[int]]] = []
        while not self.stopped.is_set() and time.monotonic() < until:
            try:
                conn, _ = self.listener.accept()
                answers.append((conn, itertools.chain(b"HTTP/1.1 200 OK\r\nX-Slow: ", itertools.repeat(ord("a")))))
                self.connections += 1
            except TimeoutError:
                pass
            for conn, answer in answers:
                try:
                    conn.send(bytes([next(answer)]))
                except OSError:  # the client left
                    pass
        for conn, _ in answers:
            conn.close()
        self.listener.close()
        self.stopped.set()

    def __enter__(self) -> Trickle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


@pytest.mark.integration
def test_a_trickling_tracking_server_costs_a_warning_never_the_job(tiny_model_dir, tmp_path):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**JOB, "max_steps": "5"})
    with Trickle() as server:
        env = {"MLFLOW_TRACKING_URI": server.url, "TRAINING_JOB_NAME": "job-trickled", TRACKING_TIMEOUT_ENV: "2"}
        done = run_train_process(job.root, env=env)
        trickling = not server.stopped.is_set()  # the job did not wait the server out
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert trickling and server.connections >= 1
    log = done.stdout + done.stderr
    assert (
        f"MLflow at {server.url} cannot be reached (NoAnswer: no answer within 2 s, BYOC_TRACKING_TIMEOUT): "
        "this job is not tracked; training goes on" in log
    )
    assert "[metrics] step=5 " in log and (job.model_dir / "model.safetensors").exists()


class _Hanging:
    """An MLflow client whose every call hangs until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()

    def __getattr__(self, method: str):
        def call(*args, **kwargs) -> None:
            self.calls.append(method)
            self.release.wait(60)

        return call


def test_a_call_that_hangs_at_the_end_turns_tracking_off_and_the_job_ends(monkeypatch, caplog):
    """SIGTERM's path: after the checkpoint the job ends its run FAILED; a server that never answers
    holds it one deadline, then tracking is off and the end's other calls are not sent."""
    client = _Hanging()
    run = tracking.Run(client, "run-1", f"http://byoc:{PASSWORD}@127.0.0.1:1", timeout=0.5)
    try:
        tracking.fail(run, "stopped: SIGTERM")
    finally:
        client.release.set()
    assert client.calls == ["set_tag"]
    assert (
        "failed to record the failure (no answer within 0.5 s, BYOC_TRACKING_TIMEOUT): "
        "tracking is off for the rest of this job; training goes on" in caplog.text
    )
    assert "byoc:***@127.0.0.1" in caplog.text and PASSWORD not in caplog.text


@pytest.mark.integration
def test_mlflows_own_log_lines_and_prints_are_masked(mlflow, monkeypatch, capsys):
    """MLflow's loggers write through a handler of their own: an error of MLflow's quoting the URI
    reaches stderr masked, and the run ends without MLflow's "View run at <URI>" line."""
    for name, value in {**tracking.QUICK_FAILURE, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "false"}.items():
        monkeypatch.setenv(name, value)  # what `start` sets for its process, restored after the test
    settings = TrainingSettings(tracking=TrackingSettings(mlflow_uri=mlflow.secret_url, experiment="byoc-tests"))
    contract = SimpleNamespace(job_name="job-in-process", instance_type="local", hosts=["algo-1"])
    run = tracking.start(settings, contract, parse_hyperparameters({}))
    assert run is not None
    try:
        logging.getLogger("mlflow.tracking").warning("API request to %s/api failed", mlflow.secret_url)
    finally:
        tracking.finish(run, {"accuracy": 1.0})
    out, err = capsys.readouterr()
    assert "API request to http://byoc:***@127.0.0.1" in err
    assert PASSWORD not in out + err and mlflow.run("byoc-tests", "job-in-process")["info"]["status"] == "FINISHED"


@pytest.mark.integration
def test_without_the_variable_nothing_of_mlflow_is_imported(tiny_model_dir, tmp_path):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**JOB, "max_steps": "5"})
    program = (
        "import sys\n"
        "from byoc.training import entry\n"
        "code = entry.run_job()\n"
        "names = sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'sagemaker_mlflow'))\n"
        "print('imported mlflow:', names)\n"
        "sys.exit(code)\n"
    )
    done = run_train_process(job.root, sys.executable, "-c", program, env={"MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported mlflow: []" in done.stdout


def test_only_rank_0_tracks_and_nothing_starts_without_a_uri(monkeypatch):
    from byoc.launch.settings import RankSettings

    args = parse_hyperparameters({})
    untracked = TrainingSettings()
    assert tracking.start(untracked, None, args) is None  # no MLFLOW_TRACKING_URI: not even an import
    other_rank = TrainingSettings(
        rank=RankSettings(rank=1, world_size=2), tracking=TrackingSettings(mlflow_uri="http://127.0.0.1:1")
    )
    assert tracking.start(other_rank, None, args) is None


def test_params_are_the_resolved_hyperparameters_with_secrets_masked():
    params = tracking.params_of(parse_hyperparameters({"epochs": "2", "model_name_or_path": "s3://key:Pa55word@b/m"}))
    assert params["epochs"] == 2 and params["model_name_or_path"] == "s3://key:***@b/m"  # a URL's password
    assert "learning_rate" in params  # a default is a resolved value too


def test_the_tracking_settings_are_read_with_the_jobs(monkeypatch):
    settings = TrainingSettings.from_env(
        {"MLFLOW_TRACKING_URI": "arn:aws:sagemaker:us-east-1:123:mlflow-tracking-server/t", "BYOC_IMAGE": "img"}
    )
    assert settings.tracking == TrackingSettings(
        "arn:aws:sagemaker:us-east-1:123:mlflow-tracking-server/t", "byoc", "img"
    )
    assert TrainingSettings.from_env({}).tracking.mlflow_uri is None
    assert TrainingSettings.from_env({TRACKING_TIMEOUT_ENV: "2.5"}).tracking.timeout == 2.5
    with pytest.raises(SettingError, match="BYOC_TRACKING_TIMEOUT='0'"):
        TrainingSettings.from_env({TRACKING_TIMEOUT_ENV: "0"})
