"""Which runtime serves the model, on which device, in which precision: a pure function of the host.

`choose(backend, precision, host)` decides from a `Host` (an NVIDIA GPU or not, ONNX Runtime's
execution providers, the model's files) and the two settings, BYOC_INFERENCE_BACKEND and
BYOC_INFERENCE_PRECISION (read with the server's others: byoc.serving.settings.InferenceSettings).
It imports nothing heavy and reads nothing itself, so every hardware and software combination is a
unit test (tests/serving/backends/test_backend_choice.py).

The rules, with both settings on `auto`:
- no GPU: ONNX Runtime on the CPU, fp32 (about a second to start, no torch import); a model that reads more
  than LONG_CONTEXT tokens on torch where it is installed (the graph's attention grows with the square of
  the length: 8.3 GB for an 8,192-token request, against torch's 1.6 GB);
- a GPU and an ONNX Runtime with the CUDA execution provider (the onnxruntime-gpu package): ONNX
  Runtime on CUDA, fp32 with TF32 matmuls. It starts without importing torch or transformers,
  which take 15-17 s on an H100 host, against a 3 s target for the first answer. fp16 there is
  opt-in: making the fp16 graph takes seconds at start (docs/serving.md);
- a GPU and a CPU-only ONNX Runtime: torch on CUDA in half precision (bf16 where the GPU has it,
  else fp16: a cast at load, free), logits returned as fp32;
- no model.onnx, no tokenizer.json or no onnxruntime: torch, on CUDA where there is a GPU.

Where torch on CUDA was picked on its own (BYOC_INFERENCE_BACKEND=auto) and the folder has its graph,
ONNX Runtime on the CPU answers while torch loads (`bridge`): about a second to the first answer instead
of the 15 s torch and CUDA take to start on an H200 host; BYOC_CPU_WHILE_LOADING=false waits for torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from byoc.errors import UserError
from byoc.serving.backends.cuda_provider import CUDA_EP

INFERENCE_BACKEND_ENV = "BYOC_INFERENCE_BACKEND"  # auto (default), onnxruntime or torch
INFERENCE_PRECISION_ENV = "BYOC_INFERENCE_PRECISION"  # auto (default), fp32, fp16, bf16 or int8
ALLOW_UNTRAINED_HEAD_ENV = "BYOC_ALLOW_UNTRAINED_HEAD"  # serve a folder whose classifier head is missing
INFERENCE_COMPILE_ENV = "BYOC_INFERENCE_COMPILE"  # torch on CUDA: 1 captures each bucket shape as a CUDA graph
CPU_WHILE_LOADING_ENV = "BYOC_CPU_WHILE_LOADING"  # torch on CUDA: ONNX Runtime on the CPU answers until it loads
BACKENDS = ("auto", "onnxruntime", "torch")
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "int8")
# Past this many tokens a model is served on torch on the CPU where it can be (auto): the exported graph's eager
# attention holds each layer's length x length scores (docs/benchmarks.md, make bench-long-context).
LONG_CONTEXT = 2048
HALF = "half"  # torch on CUDA: bf16 where the GPU supports it, else fp16 (decided once torch is imported)


class BackendError(UserError, ValueError):
    """The settings ask for something this model or host cannot serve: the message says what to change."""


@dataclass(frozen=True)
class Host:
    """What serving can use here. `providers` are ONNX Runtime's available execution providers
    (asked only on a GPU host: on the CPU the answer changes nothing)."""

    gpu: bool = False
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    onnxruntime: bool = True
    graph: bool = True  # model.onnx
    tokenizer: bool = True  # tokenizer.json
    torch: bool = True  # torch is installed (the full images; the slim serving image has none)
    tokens: int = 512  # the longest input the model reads (byoc.model_folder.max_length)

    @property
    def missing(self) -> list[str]:
        """What the ONNX Runtime backend needs and this host or model lacks."""
        return [
            what
            for what, ok in (
                ("model.onnx (the serving graph byoc train writes)", self.graph),
                ("tokenizer.json (a fast tokenizer)", self.tokenizer),
                ("the onnxruntime package", self.onnxruntime),
            )
            if not ok
        ]

    @property
    def cuda_ep(self) -> bool:
        return self.gpu and CUDA_EP in self.providers


@dataclass(frozen=True)
class Plan:
    """The choice: `backend` onnxruntime or torch, `device` cpu or cuda, `precision` fp32, fp16,
    bf16, int8 or half (torch on CUDA: bf16 where the GPU has it, else fp16)."""

    backend: str
    device: str
    precision: str
    why: str
    max_length: int | None = None  # the tokens an input is cut to, under the model's own limit (None: the model's)

    @property
    def bucketed(self) -> bool:
        """GPU paths pad batches to a few shapes (reusable kernels and graphs); the CPU pads exactly."""
        return self.device == "cuda"

    def __str__(self) -> str:
        return f"{self.backend} on {self.device}, {self.precision} ({self.why})"


def choose(backend: str, precision: str, host: Host) -> Plan:
    """The backend, device and precision for these settings on this host (BackendError if impossible)."""
    missing = " and ".join(host.missing)
    if precision == "int8":
        # ONNX Runtime's int8 kernels run on the CPU; asked for explicitly, honoured on any instance.
        if backend == "torch" or missing:
            cause = f"{INFERENCE_BACKEND_ENV}=torch" if backend == "torch" else f"{missing} is missing"
            raise BackendError(f"{INFERENCE_PRECISION_ENV}=int8 needs the ONNX Runtime backend, and {cause}")
        return Plan("onnxruntime", "cpu", "int8", "int8 is ONNX Runtime's, on the CPU")
    if backend == "onnxruntime" and missing:
        raise BackendError(
            f"{INFERENCE_BACKEND_ENV}=onnxruntime but {missing} is missing; unset it to serve with torch"
        )
    if backend == "onnxruntime" and precision == "bf16":
        raise BackendError(
            f"{INFERENCE_PRECISION_ENV}=bf16 is torch's: ONNX Runtime serves fp32, fp16 (on CUDA) or int8; "
            f"use {INFERENCE_PRECISION_ENV}=fp16, or {INFERENCE_BACKEND_ENV}=torch"
        )
    if backend == "auto":
        backend, why = _auto_backend(precision, host, missing)
    else:
        why = f"{INFERENCE_BACKEND_ENV}={backend}"
    if backend == "torch":
        device = "cuda" if host.gpu else "cpu"
        chosen = (HALF if device == "cuda" else "fp32") if precision == "auto" else precision
        return Plan("torch", device, chosen, why)
    device = "cuda" if host.cuda_ep else "cpu"
    if device == "cpu" and precision == "fp16":
        raise BackendError(
            f"{INFERENCE_PRECISION_ENV}=fp16 on ONNX Runtime needs its CUDA execution provider (onnxruntime-gpu on a "
            f"GPU instance); on the CPU use fp32 or int8, or {INFERENCE_BACKEND_ENV}=torch"
        )
    if host.gpu and device == "cpu":
        why += f"; on the CPU: this onnxruntime has no {CUDA_EP} (install onnxruntime-gpu)"
    return Plan("onnxruntime", device, "fp32" if precision == "auto" else precision, why)


def _auto_backend(precision: str, host: Host, missing: str) -> tuple[str, str]:
    if missing:
        return "torch", f"{missing} is missing"
    if precision == "bf16":
        return "torch", "bf16 is torch's"
    if not host.gpu:
        if precision == "fp16":
            return "torch", "fp16 on the CPU is torch's"
        if host.tokens > LONG_CONTEXT and host.torch:
            return "torch", (
                f"a {host.tokens}-token model on the CPU: torch's attention never holds a length x length score "
                "matrix, which the graph's does (an 8,192-token request peaked at 8.3 GB on ONNX Runtime, 1.6 GB "
                f"on torch); {INFERENCE_BACKEND_ENV}=onnxruntime serves the graph anyway"
            )
        return "onnxruntime", "no GPU: ONNX Runtime on the CPU starts without torch"
    if host.cuda_ep:
        return "onnxruntime", f"a GPU and ONNX Runtime's {CUDA_EP}: starts without torch"
    return "torch", f"a GPU, and this onnxruntime has no {CUDA_EP} (install onnxruntime-gpu)"


def bridge(plan: Plan, host: Host, backend: str) -> Plan | None:
    """ONNX Runtime on the CPU, fp32, to answer while `plan` (torch on CUDA) loads; None where it cannot or
    should not: another plan, a backend asked for by name (`backend`, the setting), something ONNX Runtime
    lacks, or a long-context model (its graph's attention holds length x length scores: LONG_CONTEXT)."""
    if plan.backend != "torch" or plan.device != "cuda" or backend != "auto" or host.missing:
        return None
    if host.tokens > LONG_CONTEXT:
        return None
    return Plan(
        "onnxruntime",
        "cpu",
        "fp32",
        f"until torch has loaded on CUDA, which then serves ({CPU_WHILE_LOADING_ENV}=false waits for it instead)",
    )


def fallback(plan: Plan, precision: str, reason: str) -> Plan:
    """Torch on the same device, where ONNX Runtime could not load (`precision`: the setting)."""
    if precision == "auto":
        precision = HALF if plan.device == "cuda" else "fp32"
    return Plan("torch", plan.device, precision, f"ONNX Runtime could not load: {reason}", plan.max_length)


def torch_dtype_name(precision: str, bf16_supported: bool, fp16_safe: bool = True) -> str:
    """The torch dtype for a plan's precision: half is bf16 where the device supports it, else fp16, or fp32
    for a model whose activations overflow fp16 (`fp16_safe` false: byoc.model_folder.FP16_OVERFLOWS), which
    asked for fp16 by name is a BackendError."""
    if precision == HALF:
        return "bfloat16" if bf16_supported else "float16" if fp16_safe else "float32"
    if precision == "fp16" and not fp16_safe:
        raise BackendError(fp16_overflow())
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]


def fp16_overflow() -> str:
    return (
        f"{INFERENCE_PRECISION_ENV}=fp16: this model's activations overflow fp16 (infinities, then NaN answers: "
        f"Gemma's and T5's kind); use {INFERENCE_PRECISION_ENV}=bf16 (torch, on a GPU that has it) or fp32"
    )
