"""The GPU serving paths, as far as a CPU can run them: ONNX Runtime's CUDA provider asked for and
checked (a CPU build must be refused, never silently used), the fp16 graph, torch in half precision,
the bucketed shapes (answers equal to exact padding), and torch.compile per shape. What only a GPU
can show (CUDA kernels, speed) is in tests/test_gpu.py and make bench-gpu."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import serve_helpers
import torch

from byoc.serving import default_pipeline
from byoc.serving.backends import cuda_provider, onnx_session, passes, runtimes
from byoc.serving.backends.backend_choice import Plan
from byoc.serving.execution.model_server import ModelServer
from byoc.serving.settings import ServeSettings
from helpers import build_classifier_with_graph

pytestmark = pytest.mark.cpu  # (the GPU's own runs: tests/test_gpu.py)

TEXTS = [
    "i love this",
    "this is the worst day of my life and nothing went right at all",
    "ok",
    "what a wonderful surprise, thank you so much",
    "meh",
] * 3


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A tiny 3-label classifier saved as byoc publishes it, with its serving graph."""
    return build_classifier_with_graph(tmp_path_factory.mktemp("classifier"), tiny_model_dir)


def feeds(n: int = 6, length: int = 13) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    ids = rng.integers(1000, 30000, size=(n, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[2, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_cuda_provider_options():
    (cuda, options), cpu = cuda_provider.providers("cuda")
    assert (cuda, cpu) == ("CUDAExecutionProvider", "CPUExecutionProvider")  # the CPU takes what CUDA cannot
    assert options["use_tf32"] == "1" and options["arena_extend_strategy"] == "kSameAsRequested"
    assert options["cudnn_conv_algo_search"] == "HEURISTIC"
    assert cuda_provider.providers("cpu") == ["CPUExecutionProvider"]


def test_a_cuda_session_that_runs_on_the_cpu_is_refused(classifier_dir):
    """ONNX Runtime runs on the CPU, with a log line, when the CUDA provider cannot load: byoc says so."""
    with pytest.raises(cuda_provider.ProviderError, match="CUDAExecutionProvider did not load.*onnxruntime-gpu"):
        onnx_session.Session(classifier_dir, threads=1, device="cuda")
    assert onnx_session.Session(classifier_dir, threads=1).provider == "CPUExecutionProvider"


def test_auto_falls_back_to_torch_when_the_cuda_provider_does_not_load(classifier_dir, monkeypatch, caplog):
    """A GPU host whose onnxruntime lists the CUDA provider, which then does not load (here: no GPU)."""
    monkeypatch.setattr(default_pipeline, "nvidia_gpu", lambda: True)
    monkeypatch.setattr(cuda_provider, "available_providers", lambda: ("CUDAExecutionProvider", "CPUExecutionProvider"))
    monkeypatch.delenv("BYOC_INFERENCE_BACKEND", raising=False)
    monkeypatch.delenv("BYOC_INFERENCE_PRECISION", raising=False)
    with caplog.at_level(logging.INFO):
        model = default_pipeline.model_fn(str(classifier_dir))
    assert model["backend"] == "torch" and "serving with torch instead of ONNX Runtime" in caplog.text
    assert "CUDAExecutionProvider did not load" in caplog.text
    assert len(default_pipeline.predict_fn({"inputs": TEXTS[:2]}, model)) == 2
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", "onnxruntime")  # asked for by name: an error, not a fallback
    with pytest.raises(cuda_provider.ProviderError):
        default_pipeline.model_fn(str(classifier_dir))


def test_on_a_gpu_served_by_torch_onnx_runtime_answers_until_torch_has_loaded(
    tmp_path_factory, tiny_model_dir, monkeypatch, caplog
):
    """A GPU host whose onnxruntime has no CUDA provider: torch on CUDA serves, and takes seconds to start
    (15 s on an H200). The folder byoc train writes answers on ONNX Runtime on the CPU meanwhile, through its
    own code/inference.py, and torch takes over between batches. Here torch sees no CUDA and loads on the
    CPU in fp32, so the answers before and after are the same."""
    folder = serve_helpers.trained_classifier(tmp_path_factory, tiny_model_dir)
    monkeypatch.setattr(default_pipeline, "nvidia_gpu", lambda: True)
    loading, real = threading.Event(), runtimes.load_torch

    def held(*args, **kwargs):  # torch's load waits until the bridge has answered
        loading.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(runtimes, "load_torch", held)
    server = ModelServer(replace(ServeSettings.from_env({}), model_dir=folder))
    with caplog.at_level(logging.INFO):
        server.load()
        assert server.error is None, server.error
        model = server.model
        assert (model.backend, model.device) == ("onnxruntime", "cpu") and model.upgrade is not None
        before = server.predict_batch(TEXTS, {"top_k": 3})
        assert model.backend == "onnxruntime"
        loading.set()
        model.upgrade.result(timeout=300)  # (the load itself, not a guessed time)
        after = server.predict_batch(TEXTS, {"top_k": 3})
    assert server.model is model and (model.backend, model.device, model.upgrade) == ("torch", "cpu", None)
    assert_same_answers(after, before, 1e-4)
    assert "answering on ONNX Runtime on the CPU until torch has loaded on CUDA" in caplog.text
    assert "now serving on torch (cpu), instead of onnxruntime on the cpu" in caplog.text

    waits = replace(ServeSettings.from_env({"BYOC_CPU_WHILE_LOADING": "false"}), model_dir=folder)
    server = ModelServer(waits)
    server.load()
    assert server.error is None and (server.model.backend, server.model.upgrade) == ("torch", None)


def test_fp16_graph_keeps_fp32_inputs_and_outputs_and_the_answers(classifier_dir, tmp_path):
    made = cuda_provider.fp16_graph(classifier_dir / "model.onnx", classifier_dir / "config.json", tmp_path)
    graph = onnx.load(str(made))
    assert [i.type.tensor_type.elem_type for i in graph.graph.input] == [onnx.TensorProto.INT64] * 3
    assert graph.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    kinds = {i.data_type for i in graph.graph.initializer if len(i.dims) == 2}
    assert onnx.TensorProto.FLOAT16 in kinds, kinds  # the weight matrices are fp16
    assert {n.op_type for n in graph.graph.node} & {"Attention", "SkipLayerNormalization"}  # fused first
    # On the CPU, ONNX Runtime runs the fp16 nodes it has no kernel for in fp32 (inserted casts): this
    # checks the conversion and the weights, not CUDA's fp16 arithmetic (make test-gpu does that).
    session = onnx_session.Session(classifier_dir, threads=1, fp16=True)
    exact = onnx_session.Session(classifier_dir, threads=1).logits(feeds())
    half = session.logits(feeds())
    assert half.dtype == np.float32 and half.shape == exact.shape
    np.testing.assert_allclose(half, exact, atol=5e-3 * max(1.0, float(np.abs(exact).max())))
    assert (half.argmax(-1) == exact.argmax(-1)).all()


def answers(model: dict, texts: list[str]) -> list:
    return default_pipeline.predict_fn({"inputs": texts, "parameters": {"top_k": 3}}, model)


def assert_same_answers(a: list, b: list, tolerance: float) -> None:
    for x, y in zip(a, b):
        assert x[0]["label"] == y[0]["label"]
        assert [e["score"] for e in x] == pytest.approx([e["score"] for e in y], abs=tolerance)


def test_torch_in_bf16_gives_fp32s_answers(classifier_dir, monkeypatch):
    """Half precision inside, fp32 logits out; bf16 runs on CPUs too, so the CPU can check it."""
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", "torch")
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "fp32")
    exact = default_pipeline.model_fn(str(classifier_dir))
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "bf16")
    half = default_pipeline.model_fn(str(classifier_dir))
    assert half["precision"] == "bfloat16" and next(half["model"].parameters()).dtype == torch.bfloat16
    assert half["logits"](feeds()).dtype == np.float32
    assert_same_answers(answers(half, TEXTS), answers(exact, TEXTS), 0.02)


def test_bucket_shapes():
    gpu = passes.gpu(max_length=512)
    assert [gpu.length(n) for n in (1, 16, 17, 20, 33, 64, 65, 100, 129, 300, 512)] == [
        16,
        16,
        32,
        32,
        48,
        64,
        96,
        128,
        192,
        384,
        512,
    ]
    assert [gpu.rows(n) for n in (1, 2, 3, 5, 17, 100, 128)] == [1, 2, 4, 8, 32, 128, 128]
    assert passes.gpu(max_length=100).length(99) == 100  # never past the model's limit
    assert passes.gpu(max_length=2048).length(700) == 768
    assert [passes.CPU.length(n) for n in (1, 17, 100)] == [1, 17, 100]  # the CPU pads exactly
    assert [passes.CPU.rows(n) for n in (3, 17)] == [3, 17]
    assert len(gpu.all()) <= 80  # few enough to capture each as a graph
    assert all(r & (r - 1) == 0 and w in passes.LENGTHS for r, w in gpu.all())


def test_bucketed_batches_are_few_shapes_and_pad_rows_that_are_never_fully_masked():
    rng = np.random.default_rng(5)
    encoded = [
        {"input_ids": [101] * n, "attention_mask": [1] * n, "token_type_ids": [0] * n} for n in rng.integers(3, 60, 300)
    ]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["input_ids"]))
    gpu = passes.gpu(max_length=512)
    seen = set()
    for chunk in passes.batches(order, encoded, gpu):
        batch = passes.pad(chunk, encoded, 0, gpu)
        seen.add(batch["input_ids"].shape)
        assert batch["attention_mask"].sum(axis=1).min() >= 1
        assert batch["input_ids"].shape[0] * batch["input_ids"].shape[1] <= gpu.token_budget
    assert seen <= set(gpu.all()) and len(seen) <= 3, seen
    cpu_passes = passes.batches(order, encoded, passes.CPU)
    assert all(len(c) * max(len(encoded[i]["input_ids"]) for i in c) <= 256 for c in cpu_passes)


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_bucketed_answers_equal_exact_padding(classifier_dir, monkeypatch, backend):
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", backend)
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "fp32")
    model = default_pipeline.model_fn(str(classifier_dir))
    assert model["passes"] == passes.CPU
    exact = answers(model, TEXTS)
    padded: list = []
    original = model["logits"]
    model = {**model, "passes": passes.gpu(model["max_length"]), "logits": lambda f: padded.append(f) or original(f)}
    assert_same_answers(answers(model, TEXTS), exact, 1e-5)
    assert padded and all(f["input_ids"].shape in passes.gpu(model["max_length"]).all() for f in padded)


@pytest.mark.integration  # compiles (inductor on the CPU: tens of seconds)
def test_torch_compile_per_shape_gives_the_eager_answers(classifier_dir):
    plan = Plan("torch", "cpu", "fp32", "test")
    eager = runtimes.load_torch(classifier_dir, plan)
    compiled = runtimes.load_torch(classifier_dir, plan, compiled=True)
    compiled["passes"] = eager["passes"] = passes.gpu(eager["max_length"])
    texts = TEXTS[:4]  # one shape
    assert_same_answers(answers(compiled, texts), answers(eager, texts), 1e-4)


def test_a_test_that_means_the_cpu_sees_no_gpu_even_on_a_gpu_machine():
    """This module is marked `cpu` (conftest): its processes and byoc's choices here see no GPU."""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert not torch.cuda.is_available() and not default_pipeline.nvidia_gpu()
