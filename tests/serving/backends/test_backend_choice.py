"""The serving backend, device and precision as a pure function of the host (byoc.serving.backends.backend_choice):
every combination of GPU, ONNX Runtime build, model files and settings, without any of them here."""

from __future__ import annotations

import pytest

from byoc.serving.backends.backend_choice import (
    CUDA_EP,
    HALF,
    BackendError,
    Host,
    Plan,
    bridge,
    choose,
    fallback,
    torch_dtype_name,
)
from byoc.serving.settings import InferenceSettings, ServeSettingsError

CPU_ORT = ("AzureExecutionProvider", "CPUExecutionProvider")  # what PyPI's onnxruntime offers
GPU_ORT = ("TensorrtExecutionProvider", CUDA_EP, "CPUExecutionProvider")  # onnxruntime-gpu

CPU_HOST = Host(gpu=False, providers=CPU_ORT)
GPU_ORT_GPU = Host(gpu=True, providers=GPU_ORT)
GPU_ORT_CPU = Host(gpu=True, providers=CPU_ORT)
NO_GRAPH_CPU = Host(gpu=False, providers=CPU_ORT, graph=False)
NO_GRAPH_GPU = Host(gpu=True, providers=GPU_ORT, graph=False)


def got(backend: str, precision: str, host: Host) -> tuple[str, str, str]:
    chosen = choose(backend, precision, host)
    return (chosen.backend, chosen.device, chosen.precision)


@pytest.mark.parametrize(
    "host, backend, precision, expected",
    [
        # A CPU instance: ONNX Runtime fp32, as before (the CPU path is unchanged).
        (CPU_HOST, "auto", "auto", ("onnxruntime", "cpu", "fp32")),
        (CPU_HOST, "auto", "fp32", ("onnxruntime", "cpu", "fp32")),
        (CPU_HOST, "torch", "auto", ("torch", "cpu", "fp32")),
        (CPU_HOST, "auto", "bf16", ("torch", "cpu", "bf16")),  # only torch has bf16; it runs on CPUs too
        (CPU_HOST, "auto", "fp16", ("torch", "cpu", "fp16")),
        # A GPU and onnxruntime-gpu: ONNX Runtime on CUDA, no torch import.
        (GPU_ORT_GPU, "auto", "auto", ("onnxruntime", "cuda", "fp32")),
        (GPU_ORT_GPU, "auto", "fp16", ("onnxruntime", "cuda", "fp16")),
        (GPU_ORT_GPU, "auto", "bf16", ("torch", "cuda", "bf16")),
        (GPU_ORT_GPU, "torch", "auto", ("torch", "cuda", HALF)),
        (GPU_ORT_GPU, "torch", "fp32", ("torch", "cuda", "fp32")),
        (GPU_ORT_GPU, "onnxruntime", "auto", ("onnxruntime", "cuda", "fp32")),
        # A GPU and the CPU-only onnxruntime: torch on CUDA in half precision.
        (GPU_ORT_CPU, "auto", "auto", ("torch", "cuda", HALF)),
        (GPU_ORT_CPU, "auto", "fp32", ("torch", "cuda", "fp32")),
        (GPU_ORT_CPU, "onnxruntime", "auto", ("onnxruntime", "cpu", "fp32")),  # asked for: on the CPU
        # int8 is ONNX Runtime's, on the CPU, on any instance.
        (CPU_HOST, "auto", "int8", ("onnxruntime", "cpu", "int8")),
        (GPU_ORT_GPU, "auto", "int8", ("onnxruntime", "cpu", "int8")),
        (GPU_ORT_CPU, "onnxruntime", "int8", ("onnxruntime", "cpu", "int8")),
        # No model.onnx (an artifact from before the graph existed): torch.
        (NO_GRAPH_CPU, "auto", "auto", ("torch", "cpu", "fp32")),
        (NO_GRAPH_GPU, "auto", "auto", ("torch", "cuda", HALF)),
        (Host(gpu=True, providers=(), onnxruntime=False), "auto", "auto", ("torch", "cuda", HALF)),
        (Host(gpu=False, providers=CPU_ORT, tokenizer=False), "auto", "auto", ("torch", "cpu", "fp32")),
    ],
)
def test_choice(host, backend, precision, expected):
    assert got(backend, precision, host) == expected


@pytest.mark.parametrize(
    "host, backend, precision, message",
    [
        (NO_GRAPH_CPU, "onnxruntime", "auto", "BYOC_INFERENCE_BACKEND=onnxruntime but model.onnx"),
        (NO_GRAPH_GPU, "auto", "int8", "int8 needs the ONNX Runtime backend, and model.onnx"),
        (CPU_HOST, "torch", "int8", "int8 needs the ONNX Runtime backend, and BYOC_INFERENCE_BACKEND=torch"),
        (GPU_ORT_GPU, "onnxruntime", "bf16", "bf16 is torch's"),
        (CPU_HOST, "onnxruntime", "fp16", "needs its CUDA execution provider"),
        (GPU_ORT_CPU, "onnxruntime", "fp16", "needs its CUDA execution provider"),
    ],
)
def test_impossible_settings_say_what_to_change(host, backend, precision, message):
    with pytest.raises(BackendError, match=message) as raised:
        choose(backend, precision, host)
    assert isinstance(raised.value, ValueError)  # what model_fn raised before


def test_every_plan_says_why():
    assert "install onnxruntime-gpu" in choose("auto", "auto", GPU_ORT_CPU).why
    assert "install onnxruntime-gpu" in choose("onnxruntime", "auto", GPU_ORT_CPU).why
    assert "model.onnx" in choose("auto", "auto", NO_GRAPH_GPU).why
    assert str(choose("auto", "auto", GPU_ORT_GPU)).startswith("onnxruntime on cuda, fp32")


def test_only_gpu_plans_pad_to_buckets():
    assert choose("auto", "auto", GPU_ORT_GPU).bucketed and choose("auto", "auto", GPU_ORT_CPU).bucketed
    assert not choose("auto", "auto", CPU_HOST).bucketed and not choose("auto", "int8", GPU_ORT_GPU).bucketed


def test_fallback_to_torch_keeps_the_device_and_an_explicit_precision():
    cuda = Plan("onnxruntime", "cuda", "fp32", "x")
    assert (fallback(cuda, "auto", "r").backend, fallback(cuda, "auto", "r").precision) == ("torch", HALF)
    assert fallback(cuda, "fp32", "r").precision == "fp32"
    assert fallback(cuda, "fp16", "r").precision == "fp16"
    cpu = fallback(Plan("onnxruntime", "cpu", "fp32", "x"), "auto", "stale graph")
    assert (cpu.backend, cpu.device, cpu.precision) == ("torch", "cpu", "fp32")
    assert "stale graph" in cpu.why


@pytest.mark.parametrize(
    "host, backend, precision, bridged",
    [
        (GPU_ORT_CPU, "auto", "auto", True),  # torch on CUDA picked on its own, the graph there: bridged
        (GPU_ORT_CPU, "auto", "bf16", True),
        (NO_GRAPH_GPU, "auto", "auto", False),  # nothing for ONNX Runtime to load
        (Host(gpu=True, providers=(), onnxruntime=False), "auto", "auto", False),
        (GPU_ORT_CPU, "torch", "auto", False),  # torch asked for by name: only torch answers
        (GPU_ORT_GPU, "auto", "auto", False),  # ONNX Runtime on CUDA starts in seconds itself
        (CPU_HOST, "auto", "auto", False),
        (CPU_HOST, "torch", "auto", False),
        (Host(gpu=True, providers=CPU_ORT, tokens=8192), "auto", "auto", False),  # the graph's attention: too big
    ],
)
def test_onnx_runtime_on_the_cpu_answers_only_while_torch_loads_on_cuda_on_its_own(host, backend, precision, bridged):
    plan = choose(backend, precision, host)
    made = bridge(plan, host, backend)
    assert (made is not None) == bridged
    if made:
        assert (made.backend, made.device, made.precision) == ("onnxruntime", "cpu", "fp32")
        assert "BYOC_CPU_WHILE_LOADING=false" in made.why


def test_settings_are_read_and_checked():
    def read(env):
        settings = InferenceSettings.from_env(env)
        return settings.backend, settings.precision

    assert read({}) == ("auto", "auto")
    assert read({"BYOC_INFERENCE_BACKEND": " Torch ", "BYOC_INFERENCE_PRECISION": "BF16"}) == ("torch", "bf16")
    assert read({"BYOC_INFERENCE_BACKEND": "", "BYOC_INFERENCE_PRECISION": ""}) == ("auto", "auto")
    with pytest.raises(ServeSettingsError, match="'tensorrt': use auto, onnxruntime or torch"):
        read({"BYOC_INFERENCE_BACKEND": "tensorrt"})
    with pytest.raises(ServeSettingsError, match="use auto, fp32, fp16, bf16 or int8"):
        read({"BYOC_INFERENCE_PRECISION": "fp8"})
    compiled = lambda env: InferenceSettings.from_env(env).compile
    assert not compiled({}) and not compiled({"BYOC_INFERENCE_COMPILE": "0"})
    assert compiled({"BYOC_INFERENCE_COMPILE": "1"}) and compiled({"BYOC_INFERENCE_COMPILE": "true"})
    with pytest.raises(ServeSettingsError, match="BYOC_INFERENCE_COMPILE='maybe': use 1 or 0"):
        compiled({"BYOC_INFERENCE_COMPILE": "maybe"})
    bridged = lambda env: InferenceSettings.from_env(env).cpu_while_loading
    assert bridged({}) and not bridged({"BYOC_CPU_WHILE_LOADING": "false"})


def test_half_is_bf16_where_the_gpu_has_it():
    assert torch_dtype_name(HALF, bf16_supported=True) == "bfloat16"
    assert torch_dtype_name(HALF, bf16_supported=False) == "float16"  # T4, V100: ml.g4dn, ml.p3
    assert [torch_dtype_name(p, False) for p in ("fp32", "fp16", "bf16")] == ["float32", "float16", "bfloat16"]


def test_a_model_that_overflows_fp16_is_served_in_bf16_or_fp32_never_fp16():
    """Gemma's activations pass fp16's range (EmbeddingGemma answered NaN in fp16: TEI #748): half precision on a
    GPU without bf16 is fp32 for it, and fp16 asked for by name is refused saying what to use."""
    from byoc import model_folder
    from byoc.serving.backends.backend_choice import HALF, BackendError, torch_dtype_name

    gemma, bert = {"model_type": "gemma3_text"}, {"model_type": "bert"}
    assert not model_folder.fp16_safe(gemma) and model_folder.fp16_safe(bert)
    assert torch_dtype_name(HALF, True, fp16_safe=False) == "bfloat16"
    assert torch_dtype_name(HALF, False, fp16_safe=False) == "float32"
    assert torch_dtype_name(HALF, False, fp16_safe=True) == "float16"
    with pytest.raises(BackendError, match="overflow fp16 .* use BYOC_INFERENCE_PRECISION=bf16"):
        torch_dtype_name("fp16", True, fp16_safe=False)


@pytest.mark.parametrize(
    "host, backend, expected",
    [
        (Host(tokens=8192), "auto", "torch"),  # its graph's attention would hold 8,192 x 8,192 scores a layer
        (Host(tokens=8192, torch=False), "auto", "onnxruntime"),  # the slim image: the graph it has
        (Host(tokens=8192), "onnxruntime", "onnxruntime"),  # asked for by name
        (Host(tokens=2048), "auto", "onnxruntime"),
        (Host(gpu=True, providers=GPU_ORT, tokens=8192), "auto", "onnxruntime"),  # (on a GPU: unchanged)
    ],
)
def test_a_long_context_model_is_served_on_torch_on_the_cpu_where_torch_is_there(host, backend, expected):
    """An 8,192-token request peaked at 8.3 GB on ONNX Runtime against 1.6 GB on torch (make bench-long-context)."""
    plan = choose(backend, "auto", host)
    assert plan.backend == expected
    if expected == "torch":
        assert "8192-token model on the CPU" in plan.why and "BYOC_INFERENCE_BACKEND=onnxruntime" in plan.why


def test_the_models_length_is_read_from_its_files_before_any_backend_loads(tmp_path):
    import json

    from byoc.serving.backends.runtimes import model_tokens

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "xlm-roberta", "max_position_embeddings": 8194, "pad_token_id": 1})
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1000000000000000019884624838656}))
    assert model_tokens(tmp_path) == 8192  # bge-m3's: its positions, less RoBERTa's offset
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    assert model_tokens(tmp_path) == 512
