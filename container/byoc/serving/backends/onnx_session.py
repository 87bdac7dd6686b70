"""An ONNX Runtime session over the model folder's serving graph (byoc.onnx_graph), for the server:
on the CPU or on ONNX Runtime's CUDA execution provider, fp32, int8 or fp16."""

from __future__ import annotations

# Imported where used: a torch-only host has no onnxruntime, and the server must start there too.
import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from byoc.onnx_graph import (
    GRAPH,
    INT8_GRAPH,
    WEIGHTS,
    GraphError,
    check_layout,
    quantize,
    recorded_layout,
    safetensors_layout,
    session_layout,
)
from byoc.serving.backends import cuda_provider

logger = logging.getLogger(__name__)


class Session:
    """An ONNX Runtime session over model.onnx; `logits(feeds)` runs one padded batch.

    `int8=True` serves a copy with the transformer's operators fused and the weights of its matrix
    multiplications quantized to int8 (dynamic quantization): `model.int8.onnx` where it was made
    for these weights, else one made at start in a temporary folder. About 2x the fp32 speed on
    CPUs with VNNI, at some cost in accuracy (README).

    `device="cuda"` runs on ONNX Runtime's CUDA execution provider (onnxruntime-gpu), and raises
    `cuda_provider.ProviderError` where that provider did not load; `fp16=True` (CUDA) serves an fp16
    copy made at start (byoc.serving.backends.cuda_provider.fp16_graph). `provider` says what runs the graph.
    """

    def __init__(
        self, model_dir: str | Path, threads: int, int8: bool = False, device: str = "cpu", fp16: bool = False
    ) -> None:
        import onnxruntime as ort

        model_dir = Path(model_dir)
        options = ort.SessionOptions()
        self.threads, self.int8, self.fp16, self.device = max(1, threads), int8, fp16, device
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initializers are noise here
        self._providers = cuda_provider.providers(device)
        if device == "cuda":
            cuda_provider.preload()
        layout = safetensors_layout(model_dir / WEIGHTS)[2]  # what every graph here must have been made from
        kind = " as int8" if int8 else " as fp16" if fp16 else ""
        try:
            if int8:
                self.session = self._int8_session(model_dir, layout, options)
            elif fp16:
                self.session = self._fp16_session(model_dir, layout, options)
            else:
                self.session = self._open(model_dir / GRAPH, options)
        except GraphError:
            raise
        except Exception as err:  # onnxruntime's and onnx's own exception types
            raise GraphError(f"ONNX Runtime cannot load {GRAPH}{kind}: {err}") from None
        if not int8:
            check_layout(session_layout(self.session), layout, model_dir)
        self.provider = cuda_provider.check_providers(self.session, device)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def _open(self, graph: Path, options: Any) -> Any:
        import onnxruntime as ort

        return ort.InferenceSession(str(graph), options, providers=self._providers)

    def _int8_session(self, model_dir: Path, layout: str, options: Any) -> Any:
        """model.int8.onnx when it was made for these weights, else an int8 graph made now (~4 s)."""
        ready = model_dir / INT8_GRAPH
        if ready.exists():
            session = self._open(ready, options)  # its metadata says which weights it was made from
            try:
                check_layout(session_layout(session), layout, model_dir, INT8_GRAPH)
                return session
            except GraphError as err:  # made for other weights: never used
                logger.warning("not using %s: %s", INT8_GRAPH, err)
        if importlib.util.find_spec("onnx") is None:  # the serving image (Dockerfile.serve) has ONNX Runtime only
            raise GraphError(
                f"int8: no {INT8_GRAPH} made from these weights, and making one at start needs the onnx package, "
                f"which this image does not have: make it ahead with `byoc export-onnx --int8 {model_dir}` (or "
                "serving_int8=true in training), or serve with a full image (Dockerfile.gpu)"
            )
        check_layout(recorded_layout(model_dir / GRAPH), layout, model_dir)  # quantizing reads model.onnx
        logger.info("int8: quantizing %s at start (`byoc export-onnx --int8 %s` saves this step)", GRAPH, model_dir)
        with tempfile.TemporaryDirectory(prefix="byoc-int8-") as scratch:  # ONNX Runtime holds the graph once open
            return self._open(quantize(model_dir, Path(scratch)), options)

    def _fp16_session(self, model_dir: Path, layout: str, options: Any) -> Any:
        """An fp16 graph made now, from model.onnx (a few seconds; opt-in for that reason)."""
        check_layout(recorded_layout(model_dir / GRAPH), layout, model_dir)
        logger.info("fp16: converting %s at start", GRAPH)
        with tempfile.TemporaryDirectory(prefix="byoc-fp16-") as scratch:
            folder = Path(scratch)
            return self._open(cuda_provider.fp16_graph(model_dir / GRAPH, model_dir / "config.json", folder), options)

    def logits(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(["logits"], {n: feeds[n] for n in self.inputs})[0]
