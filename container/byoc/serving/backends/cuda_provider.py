"""ONNX Runtime on an NVIDIA GPU: the CUDA execution provider's settings, finding CUDA and cuDNN,
checking that the provider really runs, and the fp16 copy of the serving graph.

Only the onnxruntime-gpu package has the CUDA execution provider (`onnxruntime` is CPU-only; both
install the same `onnxruntime` module, so an image has one or the other: Dockerfile.gpu installs
the GPU one). Asking a CPU-only build, or a GPU build whose CUDA libraries cannot be found, for the
CUDA provider does not fail: ONNX Runtime logs a line and runs on the CPU. `check_providers` turns
that into an error that says so, which `model_fn` answers by serving with torch on CUDA instead (or
by failing, where BYOC_INFERENCE_BACKEND=onnxruntime insists).

The tests run this module on the CPU only: they check the options, the refusal of a session that
fell back to the CPU, and the fp16 conversion. That the provider loads and how fast it runs is what
`make test-gpu` and `make bench-gpu` check on a GPU (docs/serving.md, docs/status.md).
"""

from __future__ import annotations

# Imported where used: onnxruntime's GPU checks run only on a GPU host (0.3 s), onnx only to convert to fp16.
import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
# The CUDA provider's options, as strings (ONNX Runtime's Python API takes them so):
CUDA_OPTIONS = {
    # TF32 tensor cores for fp32 matmuls on Ampere and later (ONNX Runtime's default since 1.18; said
    # here so that it is a decision): about 2x fp32 GEMMs, with 10-bit mantissa products.
    "use_tf32": "1",
    # A transformer has no convolutions; the default exhaustive cuDNN search would only cost start
    # time should a model have one.
    "cudnn_conv_algo_search": "HEURISTIC",
    # Grow the memory arena by what a request needs, not to the next power of two: the bucketed
    # shapes come back, so their blocks are reused, and GPU memory stays near the largest batch.
    "arena_extend_strategy": "kSameAsRequested",
    # Copies on the compute stream: no race between an input's copy and the kernels that read it.
    "do_copy_in_default_stream": "1",
}


class ProviderError(RuntimeError):
    """The CUDA execution provider was asked for and is not what runs the graph."""


def providers(device: str) -> list[Any]:
    """The `providers` argument of an InferenceSession for `device` (cpu or cuda)."""
    if device == "cuda":
        return [(CUDA_EP, dict(CUDA_OPTIONS)), CPU_EP]
    return [CPU_EP]


def available_providers() -> tuple[str, ...]:
    """ONNX Runtime's execution providers (importing onnxruntime, about 0.3 s); () without it."""
    try:
        import onnxruntime as ort  # imported here: the server imports this module, torch paths need no ORT
    except ImportError:
        return ()
    return tuple(ort.get_available_providers())


def preload() -> None:
    """Load CUDA and cuDNN before the session needs them, from the nvidia-* pip packages where they
    are (a torch from PyPI brings them; the DLC has them on the library path, where this changes
    nothing). `onnxruntime.preload_dlls` exists from ONNX Runtime 1.21, and does nothing in CPU builds."""
    import onnxruntime as ort

    preload_dlls = getattr(ort, "preload_dlls", None)
    if preload_dlls is None:
        return
    try:
        preload_dlls(cuda=True, cudnn=True, msvc=False)
    except Exception as err:  # a library it could not load: the session's own check says what runs
        logger.warning("onnxruntime.preload_dlls failed (%s: %s)", type(err).__name__, err)


def check_providers(session: Any, device: str) -> str:
    """The provider that runs the graph; ProviderError where CUDA was wanted and is not it."""
    running = list(session.get_providers())
    if device == "cuda" and (not running or running[0] != CUDA_EP):
        raise ProviderError(
            f"ONNX Runtime's {CUDA_EP} did not load (the session runs on {', '.join(running) or 'nothing'}): "
            "install onnxruntime-gpu (not onnxruntime) built for this CUDA major version, with cuDNN 9 on the "
            "library path or from the nvidia-cudnn pip package"
        )
    return running[0] if running else CPU_EP


def fp16_graph(graph: Path, config_path: Path, folder: Path) -> Path:
    """An fp16 copy of the graph in `folder`, inputs and logits still int64 / fp32 (keep_io_types).

    BERT operators are fused first (attention, skip-layer-norm, bias-GELU: the fused CUDA kernels
    accumulate in fp32 and use flash or memory-efficient attention), with the GPU's fusions
    (use_gpu=True). Where the fusions do not know the architecture the plain graph is converted.
    About 3 s for a MiniLM on 2 CPU cores (docs/serving.md), which is why fp16 on ONNX Runtime is
    opt-in. It records which weights it was made from (the fusion keeps model.onnx's metadata).
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    config = json.loads(config_path.read_text(encoding="utf-8"))
    target = folder / "fp16.onnx"
    try:
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(
            str(graph),
            model_type="bert",
            opt_level=0,
            use_gpu=True,
            num_heads=int(config.get("num_attention_heads", 0)),
            hidden_size=int(config.get("hidden_size", 0)),
        )
        model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(target))
    except Exception as err:  # an architecture the fusions do not know: convert the plain graph
        logger.warning("fp16: operator fusion failed (%s); converting the unfused graph", err)
        onnx.save(convert_float_to_float16(onnx.load(str(graph)), keep_io_types=True), str(target))
    return target
