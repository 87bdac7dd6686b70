"""A cross-encoder saved by sentence-transformers 6 (which writes modules.json for it, as for an embedding
model) is served as the reranker it is: TEI's rerank answers CrossEncoder.predict's scores, on torch and on
its graph, and `byoc export-onnx` writes its classifier's graph, not an embedding model's."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from byoc import onnx_graph, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol import outputs
from byoc.serving.settings import InferenceSettings

pytestmark = [pytest.mark.integration, pytest.mark.cpu]  # real models, compared with CrossEncoder on the CPU

# The folder format under test is sentence-transformers 6's (5.x, the images' tier, saves a CrossEncoder
# without modules.json: byoc reads it by its config.json, as tests/test_tasks.py checks).
if int(importlib.metadata.version("sentence-transformers").split(".")[0]) < 6:
    pytest.skip("sentence-transformers 6 writes this cross-encoder format", allow_module_level=True)

QUERY = "a cat sat on the mat"
TEXTS = ["dogs bark", "a cat is on a mat", "stock prices fell sharply after the announcement", "cats"]


def save_cross_encoder(tiny_model_dir: Path, target: Path, num_labels: int):
    """A CrossEncoder on the tiny BERT, saved by sentence-transformers' own save; its head drawn wide and
    centred on the pairs, so that their scores differ (the tiny BERT's pooled states differ little)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(str(tiny_model_dir), num_labels=num_labels, device="cpu")
    head = model.model.classifier
    with torch.no_grad():
        torch.nn.init.normal_(head.weight, std=100.0)
        logits = model.predict([(QUERY, text) for text in TEXTS], activation_fn=torch.nn.Identity())
        head.bias -= torch.as_tensor(np.asarray(logits).reshape(len(TEXTS), -1).mean(axis=0), dtype=head.bias.dtype)
    model.save(str(target))
    return CrossEncoder(str(target), device="cpu")  # as a user loads the folder: its saved activation


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, tiny_model_dir):
    """(the folder with its graph, the folder without, CrossEncoder.predict's scores of (QUERY, text))."""
    folder = tmp_path_factory.mktemp("cross-encoder") / "model"
    reference = save_cross_encoder(tiny_model_dir, folder, num_labels=1)
    graph = Path(shutil.copytree(folder, tmp_path_factory.mktemp("cross-encoder-onnx") / "model"))
    assert onnx_graph.export(graph) == graph / onnx_graph.GRAPH
    return graph, folder, reference.predict([(QUERY, text) for text in TEXTS])


def load(folder: Path, backend: str):
    with default_pipeline.serving_with(InferenceSettings(backend=backend, precision="fp32")):
        return default_pipeline.model_fn(str(folder))


def ask(model, body: dict):
    data = default_pipeline.input_fn(json.dumps(body))
    return outputs.shaped(data, default_pipeline.predict_fn(data, model))


def test_sentence_transformers_6_writes_a_cross_encoder_as_the_issue_says(cross_encoder):
    """The case itself: modules.json, beside a model_type that says CrossEncoder."""
    _, folder, _ = cross_encoder
    assert (folder / "modules.json").is_file()
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["model_type"] == "CrossEncoder"


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_rerank_answers_cross_encoder_predict(cross_encoder, backend):
    graph, folder, expected = cross_encoder
    model = load(folder if backend == "torch" else graph, backend)
    assert model["backend"] == backend and model["task"] == tasks.REGRESSION and model["activation"] == "Sigmoid"
    assert np.ptp(expected) > 0.05  # scores that differ: the order below is the model's, not chance
    ranked = ask(model, {"query": QUERY, "texts": TEXTS})
    assert [r["index"] for r in ranked] == sorted(range(len(TEXTS)), key=lambda i: -expected[i])
    assert {r["index"]: r["score"] for r in ranked} == pytest.approx(dict(enumerate(expected.tolist())), abs=1e-5)
    one = ask(model, {"inputs": ["a cat"]})  # a score (its logit), no longer a pooled vector
    assert len(one) == 1 and set(one[0]) == {"score"}


def test_export_onnx_writes_the_classifiers_graph(cross_encoder):
    graph, _, _ = cross_encoder
    output = onnx.load(str(graph / onnx_graph.GRAPH), load_external_data=False).graph.output[0]
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 1]  # one logit
    names = {i.name for i in onnx.load(str(graph / onnx_graph.GRAPH), load_external_data=False).graph.initializer}
    assert any("classifier" in name for name in names)  # the head is in the graph, not left out as unexpected


def test_a_two_label_cross_encoder_reranks_by_label_ones_probability(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    reference = save_cross_encoder(tiny_model_dir, folder, num_labels=2)
    expected = reference.predict([(QUERY, text) for text in TEXTS], apply_softmax=True)[:, 1]
    model = load(folder, "torch")
    assert model["task"] == tasks.SINGLE_LABEL and model["activation"] == "Identity"
    ranked = ask(model, {"query": QUERY, "texts": TEXTS})
    assert {r["index"]: r["score"] for r in ranked} == pytest.approx(dict(enumerate(expected.tolist())), abs=1e-5)


def test_a_cross_encoder_saved_with_another_activation_reranks_through_it(tiny_model_dir, tmp_path):
    """A folder naming Identity: CrossEncoder.predict gives the raw logit, and so does the rerank (it was
    put through a sigmoid whatever the folder said)."""
    import torch
    from sentence_transformers import CrossEncoder

    folder = tmp_path / "model"
    save_cross_encoder(tiny_model_dir, folder, num_labels=1)
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    config["activation_fn"] = "torch.nn.modules.linear.Identity"
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    reference = CrossEncoder(str(folder), device="cpu")
    assert isinstance(reference.activation_fn, torch.nn.Identity)
    expected = reference.predict([(QUERY, text) for text in TEXTS])
    ranked = ask(load(folder, "torch"), {"query": QUERY, "texts": TEXTS})
    assert {r["index"]: r["score"] for r in ranked} == pytest.approx(dict(enumerate(expected.tolist())), abs=1e-5)
