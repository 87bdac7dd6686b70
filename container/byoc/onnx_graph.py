"""The model folder's serving graph: `model.onnx` beside `model.safetensors`, run by ONNX Runtime
without torch (byoc.serving.backends.onnx_session opens it to serve).

At the end of training the classifier's forward pass is exported once with torch's ONNX exporter,
and only the graph is kept. Each weight becomes a reference (ONNX external data) to its bytes in
model.safetensors, so the artifact holds the weights once and safetensors stays their one source.
Serving then needs neither torch nor transformers: ONNX Runtime and the `tokenizers` library start
in well under a second, where importing torch and transformers takes about five, and ONNX
Runtime's CPU kernels run this model's forward pass about 1.4x faster than eager torch.

Every import of torch, transformers, onnx and onnxruntime is inside a function: the server imports
this module, and the training image may lack the ONNX packages (the model is then served by torch).
Training writes the graphs (`export`, `export_int8`); serving reads them and checks that they were
made from the weights beside them (`check_layout`).
"""

from __future__ import annotations

# Imported where used: onnx and torch only for the export (at training's end; the serving image has no torch),
# onnxruntime only for checking and quantizing the graph.
import hashlib
import inspect
import json
import logging
import os
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder, tasks
from byoc.compat import exportable, fp32_weights, unsupported_architecture
from byoc.model_folder import CONFIG, WEIGHTS

logger = logging.getLogger(__name__)

GRAPH = "model.onnx"
INT8_GRAPH = "model.int8.onnx"  # optional: the int8 graph made ahead (BYOC_INFERENCE_PRECISION=int8)
LARGE_GRAPH_BYTES = 3 << 29  # 1.5 GB of weights: past it, an int8 graph's data is written beside it (protobuf's 2 GB)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
HEADER_KEY = "byoc.safetensors_header_sha256"  # the weights layout the graph's offsets point into
TOLERANCE = 1e-4  # largest |logit difference| accepted between the graph and torch at export
_ONNX_TYPES = {"F32": 1, "F16": 10, "BF16": 16, "F64": 11, "I64": 7, "I32": 6}  # safetensors -> TensorProto


class GraphError(RuntimeError):
    """model.onnx cannot serve this model (stale, mismatched or missing pieces)."""


def safetensors_layout(path: Path) -> tuple[dict[str, Any], int, str]:
    """(header, first data byte, sha256 of the header) of a safetensors file."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        raw = f.read(size)
    return json.loads(raw), 8 + size, hashlib.sha256(raw).hexdigest()


def export(model_dir: Path, trust_remote_code: bool = False) -> Path | None:
    """Write `model_dir/model.onnx` for the model saved there (whatever task byoc serves it as:
    byoc.tasks.of_folder), checked against torch.

    Returns None, after a warning that says why, where the graph cannot be made or does not
    reproduce torch's logits: the model is then served by torch, as before. `trust_remote_code`: a folder
    that ships code of its own (auto_map) runs it to be traced (the graph then serves without it).
    """
    model_dir = Path(model_dir)
    try:
        import onnx  # noqa: F401  (torch's exporter needs it)
        import onnxruntime  # noqa: F401
    except ImportError as err:
        logger.warning(
            "no serving graph (model.onnx): %s is not installed, so the model will be served by torch "
            "(install onnx and onnxruntime for faster serving)",
            err.name,
        )
        return None
    try:
        target = _export(model_dir, trust_remote_code)
    except Exception as err:  # an architecture the exporter cannot trace must not fail the training job
        logger.warning(
            "no serving graph (model.onnx): exporting failed (%s: %s); the model will be served by torch",
            type(err).__name__,
            err,
        )
        (model_folder.weights_dir(model_dir) / GRAPH).unlink(missing_ok=True)
        return None
    logger.info("serving graph written to %s (weights stay in %s)", target, WEIGHTS)
    return target


def _export(model_dir: Path, trust_remote_code: bool = False) -> Path:
    import onnx

    # Eager attention traces to plain ops with dynamic batch and length; loading from the saved
    # folder exports exactly what was published, whatever device or state the trainer left. The
    # task's output module is what serving runs: a classifier's logits, an embedding model's pooled
    # vectors (byoc.tasks: `Task.output_module`), named "logits" in the graph either way.
    # A cross-encoder saved by sentence-transformers 6 (modules.json) is its classifier: of_folder knows it.
    files = model_folder.weights_dir(model_dir)  # (an inference-free sparse model's document transformer)
    problem = model_folder.unloadable(files)
    if problem:
        raise GraphError(problem)
    config = json.loads((files / CONFIG).read_text(encoding="utf-8"))
    unsupported = unsupported_architecture(config) or model_folder.code_problem(
        files, trust_remote_code, "--trust-remote-code (the job's trust_remote_code=true)"
    )
    if unsupported:
        raise GraphError(unsupported)
    task = tasks.of_folder(model_dir, config)
    loaded, _ = task.load_torch(
        files, attn_implementation="eager", use_safetensors=True, trust_remote_code=trust_remote_code, **fp32_weights()
    )
    accepted = inspect.signature(loaded.forward).parameters
    names = [n for n in INPUTS if n in accepted]  # DistilBERT takes no token_type_ids
    model = task.output_module(loaded.eval(), model_dir)
    try:
        graph, tensors = _trace(model, names, task)
    except Exception:
        traceable = exportable(loaded)  # a decoder whose masks the tracer cannot follow: its mask made for it
        if traceable is loaded:
            raise
        graph, tensors = _trace(task.output_module(traceable, model_dir), names, task)
    _bind_weights(graph, tensors, files / WEIGHTS)
    target = files / GRAPH
    onnx.save(graph, str(target))
    _check_against_torch(model, names, files)  # (the model as transformers runs it, its own masks: not the trace's)
    return target


def _trace(model: Any, names: list[str], task: Any) -> Any:
    """The ONNX graph of `model` (token columns `names` in, its output out), as an onnx.ModelProto whose
    weights are initializers that point into model.safetensors where it holds them (`_bind_weights`)."""
    import onnx
    import torch

    class Logits(torch.nn.Module):  # positional inputs in a fixed order, the output out
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, tensors)))

    wrapper = Logits().eval()
    sample = tuple(
        torch.ones(2, 8, dtype=torch.long) if n != "token_type_ids" else torch.zeros(2, 8, dtype=torch.long)
        for n in names
    )
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # The tracer's warnings (Python conditions on shapes, deprecations) are noise in the job
        # log: whether the graph is right is decided by _check_against_torch on another shape.
        warnings.simplefilter("ignore")
        path = Path(tmp) / GRAPH
        # export_params=False: the weights come out as graph inputs named as the module names them, and
        # _bind_weights makes them initializers. Serialising them into the graph and reading them back,
        # only to point them into the safetensors file, was half of the export's time (BERT-base: 2.5 of
        # 5 s on a 2-core CPU). do_constant_folding=False keeps every weight as it is named (folding
        # would store transposed copies under new names that safetensors does not have).
        torch.onnx.export(
            wrapper,
            sample,
            str(path),
            input_names=names,
            output_names=["logits"],
            # A token classifier's logits have a row per token: their length varies too.
            dynamic_axes={
                **{n: {0: "batch", 1: "length"} for n in names},
                "logits": dict(task.output_axes),
            },
            opset_version=17,
            dynamo=False,
            do_constant_folding=False,
            export_params=False,
        )
        graph = onnx.load(str(path))
    # (every name a tied weight or a shared buffer goes by: the tracer may use any of them)
    named = [*wrapper.named_buffers(remove_duplicate=False), *wrapper.named_parameters(remove_duplicate=False)]
    return graph, dict(named)


def _bind_weights(graph: Any, tensors: dict[str, Any], weights: Path) -> None:
    """Make each weight the graph takes as an input an initializer: a reference to its bytes in
    model.safetensors where that file holds them byte for byte, else the tensor itself (a buffer, a tied
    copy, a weight saved in another dtype). The header's hash is recorded (check_layout reads it)."""
    from onnx import TensorProto, numpy_helper

    header, start, digest = safetensors_layout(weights)
    kept, referenced = [], 0
    with weights.open("rb") as f:
        for given in graph.graph.input:
            if given.name in INPUTS:  # a token column
                kept.append(given)
                continue
            tensor = tensors.get(given.name)
            if tensor is None:
                raise GraphError(f"the traced graph takes {given.name!r}, which is neither a token column nor a weight")
            value = tensor.detach().cpu().contiguous().numpy()
            init = numpy_helper.from_array(value, given.name)
            entry = _saved_entry(header, given.name)
            if (
                entry
                and _ONNX_TYPES.get(entry["dtype"]) == init.data_type
                and list(entry["shape"]) == list(value.shape)
            ):
                begin, end = entry["data_offsets"]
                f.seek(start + begin)
                if f.read(end - begin) == value.tobytes():
                    init.ClearField("raw_data")
                    init.data_location = TensorProto.EXTERNAL
                    for key, text in (
                        ("location", WEIGHTS),
                        ("offset", str(start + begin)),
                        ("length", str(end - begin)),
                    ):
                        item = init.external_data.add()
                        item.key, item.value = key, text
                    referenced += 1
            graph.graph.initializer.append(init)
        del graph.graph.input[:]
        graph.graph.input.extend(kept)
    prop = graph.metadata_props.add()
    prop.key, prop.value = HEADER_KEY, digest
    logger.debug("%d of %d graph weights point into %s", referenced, len(graph.graph.initializer), weights.name)


def _saved_entry(header: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The safetensors header's entry for the module's weight `name` (the wrappers add "model." once each)."""
    while name not in header and name.startswith("model."):
        name = name.removeprefix("model.")
    return header.get(name)


def _check_against_torch(model: Any, names: list[str], model_dir: Path) -> None:
    """The graph must give torch's logits on a batch of another shape, padding included."""
    import torch

    rng = np.random.default_rng(0)
    high = max(2, min(int(model.config.vocab_size), 20000))
    ids = rng.integers(min(1000, high - 1), high, size=(3, 11), dtype=np.int64)  # ordinary tokens where there are any
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feeds = {n: feeds[n] for n in names}
    with torch.inference_mode():
        expected = model(**{n: torch.from_numpy(v) for n, v in feeds.items()}).float().numpy()
    got = _cpu_logits(model_dir, feeds)
    worst = float(np.abs(got - expected).max())
    if not np.isfinite(worst) or worst > TOLERANCE:
        raise GraphError(f"the graph's logits differ from torch's by {worst:.2g} (more than {TOLERANCE})")


def _cpu_logits(model_dir: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The graph's logits on ONNX Runtime's CPU kernels, one thread: the check at export."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_dir / GRAPH), options, providers=["CPUExecutionProvider"])
    check_layout(session_layout(session), safetensors_layout(model_dir / WEIGHTS)[2], model_dir)
    names = {i.name for i in session.get_inputs()}
    return session.run(["logits"], {n: v for n, v in feeds.items() if n in names})[0]


def session_layout(session: Any) -> str | None:
    """Which weights an ONNX Runtime session's graph was made from (its recorded header hash)."""
    return session.get_modelmeta().custom_metadata_map.get(HEADER_KEY)


def recorded_layout(graph_path: Path) -> str | None:
    """Which weights the graph file was made from, read without loading its weights."""
    import onnx

    graph = onnx.load(str(graph_path), load_external_data=False)
    return next((p.value for p in graph.metadata_props if p.key == HEADER_KEY), None)


def check_layout(recorded: str | None, layout: str, model_dir: Path, name: str = GRAPH) -> None:
    """GraphError unless the graph `name` was made from the weights whose header hash is `layout`."""
    if recorded != layout:
        # The graph was made from another weights file (model.onnx's byte offsets would read garbage).
        again = "byoc export-onnx --int8" if name == INT8_GRAPH else "byoc export-onnx"
        raise GraphError(
            f"{name} does not match {WEIGHTS} (the weights were saved again after export); "
            f"delete {name} or export it again with `{again} {model_dir}`"
        )


def _check_fused(graph: Path, fused: Path) -> None:
    """A GraphError where the fused graph does not answer a padded batch of two as the graph does: the BERT
    fusions also match a decoder's rotary positions, as a batch of one (Qwen3 on transformers 4.55's graph),
    which then fails at any other batch size."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in (graph, fused)]
    mask = np.array([[1] * 8, [1] * 5 + [0] * 3], dtype=np.int64)
    feeds = {
        i.name: mask if i.name == "attention_mask" else np.full((2, 8), 5 if i.name == "input_ids" else 0, np.int64)
        for i in sessions[0].get_inputs()
    }
    want, got = (session.run(None, feeds)[0] for session in sessions)
    if want.shape != got.shape or not np.allclose(want, got, rtol=1e-3, atol=1e-4):
        raise GraphError("the fused graph answers otherwise than the graph")


def _fused(model_dir: Path, folder: Path, config: dict[str, Any]) -> Path:
    """The graph with BERT's operators fused (attention, skip-layer-norm, bias-GELU) where ONNX Runtime's
    transformer optimizer recognises them and the fused graph answers as the graph does; else the graph as it
    is. Written in `folder`."""
    import onnx

    fused = folder / "fused.onnx"
    try:
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(
            str(model_dir / GRAPH),
            model_type="bert",
            opt_level=0,
            num_heads=int(config.get("num_attention_heads", 0)),
            hidden_size=int(config.get("hidden_size", 0)),
        )
        model.save_model_to_file(str(fused))
        _check_fused(model_dir / GRAPH, fused)
    except Exception as err:  # an architecture the fusions do not know: quantize the plain graph
        logger.warning("int8: operator fusion failed (%s); quantizing the unfused graph", err)
        onnx.save(onnx.load(str(model_dir / GRAPH)), str(fused))
    return fused


def quantize(model_dir: Path, folder: Path) -> Path:
    """An int8 copy of the graph in `folder` (`_fused` first), then dynamic quantization of the weights, per
    output column (activations are quantized per batch at run time)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    # Over protobuf's 2 GB (a 0.6B model's fp32 weights), a graph holds its weights in a file beside it: the
    # fusion is skipped (it writes one proto) and the quantizer writes its int8 graph's data beside it.
    weights = model_dir / WEIGHTS
    large = weights.exists() and weights.stat().st_size > LARGE_GRAPH_BYTES
    if large:
        logger.info(
            "int8: weights over %.1f GB: the graph quantized unfused, its data beside it", LARGE_GRAPH_BYTES / 2**30
        )
        fused = model_dir / GRAPH  # (its weights read from model.safetensors, where it points)
    else:
        fused = _fused(model_dir, folder, config)
    target = folder / INT8_GRAPH  # (its data file, if any, is named after it: it moves beside it as it is)
    root = logging.getLogger()
    level = root.level
    # The quantizer logs a line per tensor on the root logger, and advice to run its pre-processing
    # (shape inference, which the fusion above has done).
    root.setLevel(logging.ERROR)
    try:
        # One scale per output column, not one per matrix: on the emotion model this agreed with
        # fp32 on 98% of the test tweets against 95%, at the same speed (README, int8).
        quantize_dynamic(
            str(fused),
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            use_external_data_format=large,
        )
    finally:
        root.setLevel(level)
    # Self-contained below LARGE_GRAPH_BYTES (every weight it needs is inside, int8 mostly); the fusion and the
    # quantizer keep model.onnx's metadata, so it records the weights it was made from (HEADER_KEY).
    return target


def export_int8(model_dir: Path) -> Path | None:
    """Write `model_dir/model.int8.onnx`, so that int8 serving starts without quantizing. It is
    self-contained (about a quarter of the fp32 weights' size) and records which weights it was
    made from: after the weights change it is ignored, with a warning. None, after a warning, where
    it cannot be made (int8 serving then quantizes at start, or says why it cannot)."""
    model_dir = model_folder.weights_dir(Path(model_dir))  # where model.onnx is
    try:
        with tempfile.TemporaryDirectory(prefix="byoc-int8-", dir=model_dir) as scratch:
            made = quantize(model_dir, Path(scratch))
            for data in made.parent.glob(f"{INT8_GRAPH}.data"):  # (a large model's int8 weights, beside the graph)
                os.replace(data, model_dir / data.name)
            os.replace(made, model_dir / INT8_GRAPH)
    except Exception as err:  # never fails the training job that asked for it
        logger.warning("no int8 serving graph (%s): %s: %s", INT8_GRAPH, type(err).__name__, err)
        return None
    logger.info("int8 serving graph written to %s", model_dir / INT8_GRAPH)
    return model_dir / INT8_GRAPH
