"""The fixtures; everything else the tests share is in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import Job, build_tiny_bert

# Test files that run in the main tier only (marked `once`; `make test-xla` deselects them). What
# they check does not change with the torch, transformers or torch-xla version: the server's own
# behaviour on ONNX Runtime (connections, limits, hostile requests, multi-model, async), parsing,
# docs, the architecture's walls, shell scripts, requirement files, a venv or a benchmark script
# of their own. Everything that drives torch, transformers, datasets or torch-xla (training,
# launch, resume, checkpoints, compat, the torch serving backend, the ONNX export, the XLA path)
# runs in both tiers. docs/testing.md lists them.
ONCE = frozenset(
    {
        "test_architecture.py",
        "test_bench_gpu.py",
        "test_bench_serve.py",
        "test_cli.py",
        "test_build_and_push.py",
        "test_contract.py",
        "test_demo.py",
        "test_safe_files.py",
        "test_gpu_image_requirements.py",
        "test_import_paths.py",
        "test_logs.py",
        "test_model_folder.py",
        "test_readme.py",
        "test_pip_in_steps.py",
        "test_requirements.py",
        "test_settings.py",
        "test_shared_data.py",
        "launch/test_efa.py",
        "encoding/test_settings.py",
        "encoding/test_corpus.py",
        "encoding/test_shards.py",
        "encoding/test_columns.py",
        "encoding/test_vector_store.py",
        "launch/test_script_rank.py",
        "serving/test_async_profile.py",
        "serving/execution/test_batching.py",
        "serving/http/test_connections.py",
        "serving/test_hostile.py",
        "serving/test_resources.py",
        "serving/test_multi_model.py",
        "serving/test_multi_model_isolation.py",
        "serving/user_code/test_model_code.py",
        "serving/protocol/test_negotiation.py",
        "serving/backends/test_loaded.py",
        "serving/execution/test_request_path.py",
        "serving/test_prometheus.py",
        "serving/test_properties.py",
        "serving/test_serving_venv.py",
        "serving/test_settings.py",
        "serving/execution/test_threads.py",
        "serving/test_under_fire.py",
    }
)  # paths under tests/
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(TESTS).as_posix() in ONCE:
            item.add_marker(pytest.mark.once)


@pytest.fixture(autouse=True)
def _the_cpu_where_a_test_means_it(request, monkeypatch) -> None:
    """A test marked `cpu` means the CPU (its answers are compared with a reference's on the CPU, at fp32's
    tolerances): on a machine with a GPU, the GPU is hidden from it. Its processes get CUDA_VISIBLE_DEVICES
    empty; in this process torch sees no CUDA and serving no NVIDIA device. Elsewhere this changes nothing."""
    if request.node.get_closest_marker("cpu") is None:
        return
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny BERT (build_tiny_bert): trains in seconds on CPU."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def job(tmp_path, monkeypatch) -> Job:
    """An empty job tree; SAGEMAKER_BASE_DIR points at it and caches stay inside tmp_path."""
    root = tmp_path / "opt-ml"
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.delenv("SM_OUTPUT_DATA_DIR", raising=False)
    return Job(root).resources()
