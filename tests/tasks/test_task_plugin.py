"""A task is one place: a task defined entirely here, in a package of its own that declares it in the
entry-point group `byoc.tasks`, is trained by the real `byoc train` and served by the real `byoc serve`,
end to end, with no edit anywhere in byoc (issue 56). The package is a module and its dist-info on the
processes' PYTHONPATH, as `pip install` would leave them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_helpers import Server

from helpers import build_job, run_train_process

pytestmark = pytest.mark.integration  # a real job and a server in processes

TASK = '''
from byoc.tasks.single_label import SingleLabel


class Polarity(SingleLabel):
    """How positive a text is, from -1 to 1: a two-label classifier's head and recipe, its own answer."""

    name = "sentiment_polarity"
    aliases = ("polarity",)
    described = "a polarity model"
    parameters = ()

    def answer(self, scores, id2label, parameters, model):
        positive = [name for _, name in sorted(id2label.items())].index("positive")
        return [{"polarity": round(float(2 * row[positive] - 1), 6)} for row in scores]
'''


def plugin_package(folder: Path) -> Path:
    """`polarity_task.py` and the dist-info of `byoc-polarity`, whose entry point names its task."""
    folder.mkdir(parents=True)
    (folder / "polarity_task.py").write_text(TASK)
    info = folder / "byoc_polarity-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: byoc-polarity\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[byoc.tasks]\npolarity = polarity_task:Polarity\n")
    return folder


def test_a_task_from_another_package_trains_and_serves_with_no_edit_in_byoc(tmp_path, tiny_model_dir):
    env = {"PYTHONPATH": str(plugin_package(tmp_path / "site"))}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {"task": "polarity", "max_steps": "20"}, train=48)
    done = run_train_process(job.root, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert job.metrics["task"] == "sentiment_polarity" and "eval_accuracy" not in job.metrics  # no eval data
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["byoc_task"] == "sentiment_polarity" and (job.model_dir / "model.onnx").exists()

    server = Server(job.model_dir, env={**env, "BYOC_INFERENCE_BACKEND": "onnxruntime"})
    try:
        server.wait_ready()
        answer = server.invoke({"inputs": ["i love this so much", "i hate this a lot"]})
        assert answer.status_code == 200, answer.text
        assert [set(a) for a in answer.json()] == [{"polarity"}, {"polarity"}]
        assert all(-1 <= a["polarity"] <= 1 for a in answer.json())
        refused = server.invoke({"inputs": ["a text"], "parameters": {"top_k": 2}})
        assert refused.status_code == 400 and "does not apply to a polarity model" in refused.json()["error"]
    finally:
        server.stop()
