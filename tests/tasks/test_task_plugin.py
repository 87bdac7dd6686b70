"""A task is one place: a task defined entirely here, in a package of its own that declares it in the
entry-point group `byoc.tasks`, is trained by the real `byoc train` and served by the real `byoc serve`,
end to end, with no edit anywhere in byoc (issue 56): its head (its own answer, from what its folder says) and its
recipe with a hyperparameter of its own (issue 71). The package is a module and its dist-info on the processes'
PYTHONPATH, as `pip install` would leave them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_helpers import Server

from helpers import build_job, run_train_process

pytestmark = pytest.mark.integration  # a real job and a server in processes

TASK = '''
from byoc.sdk_values import Bound
from byoc.tasks.settings import RecipeSetting
from byoc.tasks.single_label import SingleLabel, SingleLabelHead, SingleLabelRecipe

NEUTRAL_BAND = RecipeSetting(
    "neutral_band",
    float | None,
    None,
    "Polarity models: a polarity closer to 0 than this is answered as 0 (neutral).",
    bound=Bound(0, 1, high_open=True),
)


class PolarityHead(SingleLabelHead):
    """Its own answer, from what its folder says."""

    parameters = ()

    def serving_facts(self, model_dir, config):
        return {"neutral_band": float(config.get("polarity_neutral_band") or 0.0)}

    def answer(self, scores, id2label, parameters, model):
        positive = [name for _, name in sorted(id2label.items())].index("positive")
        polarity = [2 * float(row[positive]) - 1 for row in scores]
        return [{"polarity": round(p if abs(p) >= model["neutral_band"] else 0.0, 6)} for p in polarity]


class PolarityRecipe(SingleLabelRecipe):
    """A two-label classifier's recipe, with a hyperparameter of its own, saved in config.json."""

    recipe_settings = (NEUTRAL_BAND,)

    def apply_recipe(self, model, settings):
        model.config.polarity_neutral_band = settings.get("neutral_band") or 0.0


class Polarity(SingleLabel):
    """How positive a text is, from -1 to 1: a two-label classifier's rows and evaluation, its own head and
    recipe."""

    name = "sentiment_polarity"
    aliases = ("polarity",)
    described = "a polarity model"
    head_class = PolarityHead
    recipe_class = PolarityRecipe
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
    hyperparameters = {"task": "polarity", "max_steps": "20", "neutral_band": "0.999"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, hyperparameters, train=48)
    done = run_train_process(job.root, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert job.metrics["task"] == "sentiment_polarity" and "eval_accuracy" not in job.metrics  # no eval data
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["byoc_task"] == "sentiment_polarity" and (job.model_dir / "model.onnx").exists()
    assert config["polarity_neutral_band"] == 0.999  # the recipe's own hyperparameter, parsed and applied

    server = Server(job.model_dir, env={**env, "BYOC_INFERENCE_BACKEND": "onnxruntime"})
    try:
        server.wait_ready()
        answer = server.invoke({"inputs": ["i love this so much", "i hate this a lot"]})
        assert answer.status_code == 200, answer.text
        assert [set(a) for a in answer.json()] == [{"polarity"}, {"polarity"}]
        # A tiny model 20 steps from random is far from sure of either label: within the band, so neutral.
        assert [a["polarity"] for a in answer.json()] == [0.0, 0.0]
        refused = server.invoke({"inputs": ["a text"], "parameters": {"top_k": 2}})
        assert refused.status_code == 400 and "does not apply to a polarity model" in refused.json()["error"]
    finally:
        server.stop()


def test_a_plug_in_s_hyperparameter_is_checked_as_byoc_s_own(tmp_path, tiny_model_dir):
    """Out of its range, the plug-in recipe's setting is refused before any data is read, as byoc's own are."""
    env = {"PYTHONPATH": str(plugin_package(tmp_path / "site"))}
    hyperparameters = {"task": "polarity", "max_steps": "2", "neutral_band": "1.5"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, hyperparameters, train=8)
    done = run_train_process(job.root, env=env)
    assert done.returncode != 0
    assert "neutral_band" in job.failure and "[0, 1)" in job.failure, job.failure
