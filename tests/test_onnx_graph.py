"""The serving graph (model.onnx): exported against safetensors, checked, refused when stale,
and served by the default handlers without torch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from byoc import onnx_graph
from byoc.serving import default_pipeline
from byoc.serving.backends import onnx_session
from byoc.serving.settings import InferenceSettings
from helpers import build_classifier_with_graph

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A tiny 3-label classifier saved as byoc publishes it, with its serving graph."""
    return build_classifier_with_graph(tmp_path_factory.mktemp("classifier"), tiny_model_dir)


def torch_logits(model_dir: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()


def test_a_traced_input_neither_token_column_nor_weight_is_refused(classifier_dir, tmp_path):
    graph = onnx.load(str(classifier_dir / "model.onnx"), load_external_data=False)
    stray = graph.graph.input.add()
    stray.name = "past_key_values.0"
    with pytest.raises(onnx_graph.GraphError, match="past_key_values.0.*neither a token column nor a weight"):
        onnx_graph._bind_weights(graph, {}, classifier_dir / "model.safetensors")


def test_graph_holds_no_weights_and_gives_torchs_logits(classifier_dir):
    graph = onnx.load(str(classifier_dir / "model.onnx"), load_external_data=False)
    weights = [i for i in graph.graph.initializer if i.name.startswith("model.")]
    assert weights and all(i.data_location == onnx.TensorProto.EXTERNAL for i in weights)
    assert {e.value for i in weights for e in i.external_data if e.key == "location"} == {"model.safetensors"}
    assert (classifier_dir / "model.onnx").stat().st_size < (classifier_dir / "model.safetensors").stat().st_size / 4
    # Traced without its weights (export_params=False), the graph takes only the token columns: a weight
    # left as an input could be fed by a caller, and ONNX Runtime would not fold it.
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]

    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 30000, size=(5, 23), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[2, 9:] = 0  # a padded row
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    expected = torch_logits(classifier_dir, feeds)
    np.testing.assert_allclose(onnx_session.Session(classifier_dir, threads=1).logits(feeds), expected, atol=1e-5)

    # The graph also loads on its own: its offsets point into model.safetensors.
    plain = ort.InferenceSession(str(classifier_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(plain.run(["logits"], feeds)[0], expected, atol=1e-5)


def test_a_graph_from_other_weights_is_refused(classifier_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(classifier_dir, copy)
    tensors = load_file(copy / "model.safetensors")
    tensors["extra.weight"] = torch.zeros(7)  # a new layout: every offset may have moved
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(onnx_graph.GraphError, match="does not match model.safetensors.*export-onnx"):
        onnx_session.Session(copy, threads=1)


def test_export_failure_leaves_no_graph_and_says_why(classifier_dir, tmp_path, monkeypatch, caplog):
    copy = tmp_path / "model"
    shutil.copytree(classifier_dir, copy)
    (copy / "model.onnx").unlink()

    def refuse(*args, **kwargs):
        raise RuntimeError("this architecture cannot be traced")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with caplog.at_level(logging.WARNING):
        assert onnx_graph.export(copy) is None
    assert not (copy / "model.onnx").exists()
    assert "cannot be traced" in caplog.text and "served by torch" in caplog.text


@pytest.mark.integration  # byoc in processes of its own
def test_export_onnx_command(classifier_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(classifier_dir, copy)
    (copy / "model.onnx").unlink()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "byoc"), "export-onnx", str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (copy / "model.onnx").exists() and "serving graph written" in done.stderr + done.stdout
    bad = subprocess.run(
        [str(Path(sys.executable).parent / "byoc"), "export-onnx", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and "exporting failed" in bad.stderr + bad.stdout


def _handlers_in_subprocess(model_dir: Path, backend: str, texts: list) -> dict:
    """What a model's code/inference.py (the template: byoc.inference's handlers, predict_fn overridden)
    does in a fresh interpreter: answers, backend, and what got imported."""
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('inference', {str(REPO / 'code' / 'inference.py')!r})\n"
        "inference = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(inference)\n"
        f"model = inference.model_fn({str(model_dir)!r})\n"
        f"answers = inference.predict_fn({{'inputs': {texts!r}, 'parameters': {{'top_k': 3}}}}, model)\n"
        "print(json.dumps({'backend': model['backend'], 'answers': answers,\n"
        "                  'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    env = {**os.environ, "BYOC_INFERENCE_BACKEND": backend}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TEXTS = ["i love this so much", "rude people and cold food", ["is it good?", "yes, very good"], "x " * 400]


@pytest.mark.integration  # byoc in processes of its own
@pytest.mark.cpu  # torch's answers on the CPU, to 1e-5
def test_default_handlers_serve_the_graph_without_torch_and_agree_with_torch(classifier_dir):
    # The CPU default (auto picks it where there is no GPU: test_backend_choice), asked for by name
    # so that it runs the same with a GPU present.
    fast = _handlers_in_subprocess(classifier_dir, "onnxruntime", TEXTS)
    assert fast["backend"] == "onnxruntime" and not fast["torch"] and not fast["transformers"]
    slow = _handlers_in_subprocess(classifier_dir, "torch", TEXTS)
    assert slow["backend"] == "torch"
    for a, b in zip(fast["answers"], slow["answers"]):
        assert [x["label"] for x in a] == [x["label"] for x in b]
        assert [x["score"] for x in a] == pytest.approx([x["score"] for x in b], abs=1e-5)


def test_backend_choice(classifier_dir, tmp_path, monkeypatch, caplog):
    no_graph = tmp_path / "plain"
    shutil.copytree(classifier_dir, no_graph)
    (no_graph / "model.onnx").unlink()
    monkeypatch.delenv("BYOC_INFERENCE_BACKEND", raising=False)
    assert default_pipeline.choose_backend(classifier_dir, gpu=False) == "onnxruntime"
    cuda_ep = "CUDAExecutionProvider" in ort.get_available_providers()  # onnxruntime-gpu: ONNX Runtime on CUDA
    assert default_pipeline.choose_backend(classifier_dir, gpu=True) == ("onnxruntime" if cuda_ep else "torch")
    assert default_pipeline.choose_backend(classifier_dir, int8=True, gpu=True) == "onnxruntime"  # int8: the CPU's
    gpu_here = Path("/dev/nvidia0").exists() and not cuda_ep
    assert default_pipeline.choose_backend(classifier_dir) == ("torch" if gpu_here else "onnxruntime")
    assert default_pipeline.choose_backend(no_graph, gpu=False) == "torch"  # an artifact from before the graph existed
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", "onnxruntime")
    with pytest.raises(ValueError, match="model.onnx"):
        default_pipeline.choose_backend(no_graph)
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match="use auto, onnxruntime or torch"):
        default_pipeline.choose_backend(classifier_dir)

    stale = tmp_path / "stale"  # weights saved again in another layout: torch serves, with a warning
    shutil.copytree(classifier_dir, stale)
    tensors = load_file(stale / "model.safetensors")
    save_file(
        dict(reversed(list(tensors.items()))) | {"extra.weight": torch.zeros(3)},
        stale / "model.safetensors",
        metadata={"format": "pt"},
    )
    monkeypatch.delenv("BYOC_INFERENCE_BACKEND")
    monkeypatch.setattr(default_pipeline, "nvidia_gpu", lambda: False)  # auto picks ONNX Runtime, then falls back
    with caplog.at_level(logging.WARNING):
        assert default_pipeline.model_fn(str(stale))["backend"] == "torch"
    assert "serving with torch instead of ONNX Runtime" in caplog.text


def test_serving_on_torch_for_want_of_a_graph_says_how_to_write_it(classifier_dir, tmp_path, monkeypatch, caplog):
    """No model.onnx: torch serves (seconds more at each start), and the log names `byoc export-onnx`; not
    where torch was asked for."""
    no_graph = tmp_path / "plain"
    shutil.copytree(classifier_dir, no_graph)
    (no_graph / "model.onnx").unlink()
    monkeypatch.setattr(default_pipeline, "nvidia_gpu", lambda: False)
    with caplog.at_level(logging.INFO), default_pipeline.serving_with(InferenceSettings()):
        assert default_pipeline.model_fn(str(no_graph))["backend"] == "torch"
    assert "has no model.onnx, so torch serves it" in caplog.text
    assert f"`byoc export-onnx {no_graph}`" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO), default_pipeline.serving_with(InferenceSettings(backend="torch")):
        assert default_pipeline.model_fn(str(no_graph))["backend"] == "torch"
    assert "byoc export-onnx" not in caplog.text


def test_int8_session_quantizes_and_stays_close(classifier_dir, tmp_path):
    graph = onnx.load(str(onnx_graph.quantize(classifier_dir, tmp_path)))
    kinds = {node.op_type for node in graph.graph.node}
    assert kinds & {"QAttention", "DynamicQuantizeMatMul", "MatMulInteger"}, kinds  # int8 kernels in use
    # Per-channel weights: each quantized matrix has one scale (and zero point) per output column.
    # MatMulInteger(a, b, a_zero_point, b_zero_point); QAttention(x, w, bias, x_scale, w_scale, ...).
    weights = {init.name: init for init in graph.graph.initializer}
    per_column = {"MatMulInteger": 3, "QAttention": 4}
    quantized = [node for node in graph.graph.node if node.op_type in per_column]
    assert quantized
    for node in quantized:
        matrix, scale = weights[node.input[1]], weights[node.input[per_column[node.op_type]]]
        assert list(scale.dims) == [matrix.dims[1]], (node.name, scale.dims, matrix.dims)

    rng = np.random.default_rng(2)
    ids = rng.integers(1000, 30000, size=(16, 12), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    exact = onnx_session.Session(classifier_dir, threads=1).logits(feeds)
    session = onnx_session.Session(classifier_dir, threads=1, int8=True)
    approx = session.logits(feeds)
    assert session.int8 and approx.shape == exact.shape and not np.array_equal(approx, exact)
    assert np.abs(approx - exact).max() < 0.1 * max(1.0, np.abs(exact).max())


def test_the_int8_graph_of_weights_past_protobufs_2_gb_keeps_its_data_beside_it(classifier_dir, tmp_path, monkeypatch):
    """A 0.6B model's fp32 weights (2.4 GB) failed to quantize ("Failed to serialize proto"): past
    LARGE_GRAPH_BYTES the graph is quantized as it is and its int8 weights written beside it, served alike."""
    copy = Path(shutil.copytree(classifier_dir, tmp_path / "model"))
    monkeypatch.setattr(onnx_graph, "LARGE_GRAPH_BYTES", 1)  # (the tiny model's weights count as large)
    assert onnx_graph.export_int8(copy) == copy / onnx_graph.INT8_GRAPH
    assert (copy / f"{onnx_graph.INT8_GRAPH}.data").is_file() and not list(copy.glob("byoc-int8-*"))
    rng = np.random.default_rng(4)
    ids = rng.integers(1000, 30000, size=(4, 9), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    exact = onnx_session.Session(copy, threads=1).logits(feeds)
    approx = onnx_session.Session(copy, threads=1, int8=True).logits(feeds)
    assert np.abs(approx - exact).max() < 0.1 * max(1.0, np.abs(exact).max())


def test_a_graph_made_at_start_leaves_no_scratch_folder(classifier_dir, tmp_path, monkeypatch):
    """int8 made at start was kept in a temporary folder for the server's life, and left behind when the
    server was stopped (a test run leaked 1.1 GB of them): ONNX Runtime holds the graph once it is open."""
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    copy = Path(shutil.copytree(classifier_dir, tmp_path / "model"))
    monkeypatch.setattr(onnx_graph, "LARGE_GRAPH_BYTES", 1)  # its weights in a file beside the graph, read too
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, 30000, size=(4, 9), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    session = onnx_session.Session(copy, threads=1, int8=True)
    assert not list(scratch_root.iterdir())  # made, opened and gone
    exact = onnx_session.Session(copy, threads=1).logits(feeds)
    assert np.abs(session.logits(feeds) - exact).max() < 0.1 * max(1.0, np.abs(exact).max())


@pytest.mark.integration  # byoc in processes of its own
def test_int8_graph_made_ahead_is_used_and_refused_when_stale(classifier_dir, tmp_path, monkeypatch, caplog):
    copy = tmp_path / "model"
    shutil.copytree(classifier_dir, copy)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "byoc"), "export-onnx", "--int8", str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (copy / onnx_graph.INT8_GRAPH).exists() and not list(copy.glob("byoc-int8-*"))  # no scratch left
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 30000, size=(4, 9), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    made_at_start = onnx_session.Session(classifier_dir, threads=1, int8=True).logits(feeds)

    def no_quantizing(*args, **kwargs):
        raise AssertionError("quantized at start although model.int8.onnx was there")

    monkeypatch.setattr(onnx_graph, "quantize", no_quantizing)
    np.testing.assert_allclose(onnx_session.Session(copy, threads=1, int8=True).logits(feeds), made_at_start, atol=1e-6)

    # New weights, old int8 graph (and a fresh fp32 one): the int8 graph is ignored, with a warning.
    tensors = load_file(copy / "model.safetensors")
    tensors["extra.weight"] = torch.zeros(7)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.undo()
    assert onnx_graph.export(copy)
    with caplog.at_level(logging.INFO):
        onnx_session.Session(copy, threads=1, int8=True)
    assert "not using model.int8.onnx" in caplog.text and "quantizing model.onnx at start" in caplog.text


def test_int8_choice(classifier_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "int8")
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", "torch")
    with pytest.raises(ValueError, match="int8 needs the ONNX Runtime backend"):
        default_pipeline.model_fn(str(classifier_dir))
    monkeypatch.delenv("BYOC_INFERENCE_BACKEND")
    for gpu in (False, True):  # int8 is ONNX Runtime's on the CPU, on a GPU instance too
        monkeypatch.setattr(default_pipeline, "nvidia_gpu", lambda gpu=gpu: gpu)
        model = default_pipeline.model_fn(str(classifier_dir))
        assert model["backend"] == "onnxruntime" and model["model"].int8
    assert len(default_pipeline.predict_fn({"inputs": ["a text", "another one"]}, model)) == 2
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "fp8")
    with pytest.raises(ValueError, match="use auto, fp32, fp16, bf16 or int8"):
        default_pipeline.model_fn(str(classifier_dir))


def test_export_of_a_model_with_a_small_vocabulary(tmp_path):
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(tmp_path, safe_serialization=True)
    assert onnx_graph.export(tmp_path) == tmp_path / "model.onnx"
