"""The import paths users' code depends on keep working after the package took rooms: every trained
model's code/inference.py imports `byoc.inference`, older models' copies import `byoc.handlers`,
copies of code/train.py import `byoc.job` and `byoc.distributed`, and the README imports
`byoc.metrics.METRIC_DEFINITIONS`. The files below are frozen copies of what byoc wrote before the
move (not today's templates), so that the old paths stay tested whatever the templates become."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import serve_helpers
from serve_helpers import TEXTS, Server

from helpers import Job, run_train_process, sentiment_rows, write_csv

pytestmark = pytest.mark.integration  # servers and a training job in processes

# code/inference.py as every model trained before the move carries it.
TEMPLATE_BEFORE_THE_MOVE = """
from typing import Any

from byoc import inference as defaults
from byoc.inference import input_fn, model_fn, output_fn

__all__ = ["model_fn", "input_fn", "predict_fn", "output_fn"]


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    answers = defaults.predict_fn(data, model)
    return answers


predict_fn.batchable = True
"""

# Older models' own handlers: the errors and the thread count imported from byoc.handlers.
HANDLERS_BEFORE_THE_MOVE = """
from byoc.handlers import InputError, inference_threads
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    assert inference_threads() >= 1
    if data["inputs"] == ["refuse me"]:
        raise InputError("refused, as asked")
    return default(data, model)


predict_fn.batchable = True
"""

# code/train.py's imports before the move (the steps themselves are today's).
TRAIN_PY_BEFORE_THE_MOVE = """
import sys

from byoc.cli import run_job
from byoc.logs import configure_logging


def main(contract, args) -> dict:
    from byoc import distributed, job

    with job.stop_on_sigterm() as stop:
        setup = job.prepare(contract, args)
        model = job.load_model(setup)
        trainer = job.make_trainer(setup, model)
        metrics = job.train_and_evaluate(setup, trainer, stop)
        metrics = job.finish(setup, trainer, metrics)
    distributed.teardown()
    return metrics


if __name__ == "__main__":
    configure_logging()
    sys.exit(run_job(main))
"""


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)


@pytest.mark.parametrize("source", [TEMPLATE_BEFORE_THE_MOVE, HANDLERS_BEFORE_THE_MOVE], ids=["template", "handlers"])
def test_a_model_written_before_the_move_still_loads_and_serves(classifier, tmp_path, source):
    s = Server(serve_helpers.model_with_code(classifier, tmp_path, source))
    try:
        s.wait_ready()
        answer = s.invoke({"inputs": TEXTS})
        refused = s.invoke({"inputs": ["refuse me"]})
    finally:
        log = s.stop()
    assert answer.status_code == 200 and len(answer.json()) == len(TEXTS), log[-2000:]
    assert "(predict_fn overridden)" in log
    if source is HANDLERS_BEFORE_THE_MOVE:
        assert refused.status_code == 400 and refused.json()["error"] == "refused, as asked"


def test_a_copy_of_code_train_py_from_before_the_move_still_trains(tmp_path, tiny_model_dir):
    source = tmp_path / "source"
    source.mkdir()
    (source / "train.py").write_text(TRAIN_PY_BEFORE_THE_MOVE)
    job = Job(tmp_path / "opt-ml").resources()
    job.hyperparameters(
        {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(str(source)),
            "max_steps": json.dumps(3),
        }
    )
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(24))
    done = run_train_process(job.root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (job.model_dir / "model.safetensors").exists()


def test_the_readmes_import_of_the_metric_definitions():
    from byoc.metrics import METRIC_DEFINITIONS
    from byoc.training import metrics

    assert METRIC_DEFINITIONS is metrics.METRIC_DEFINITIONS and METRIC_DEFINITIONS


def test_the_old_paths_are_the_same_objects_not_copies():
    """The server tells a user's override from a re-exported default by identity."""
    import byoc.handlers
    import byoc.inference
    from byoc.serving import default_pipeline
    from byoc.serving.protocol import request_errors

    assert byoc.inference.predict_fn is default_pipeline.predict_fn
    assert byoc.handlers.InputError is request_errors.InputError
