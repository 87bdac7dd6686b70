"""Loading a model for the default handlers, on the backend `byoc.serving.backends.backend_choice` picked: ONNX
Runtime (CPU or CUDA execution provider) or torch (CPU or CUDA, fp32 or half precision).

Both loaders return a `LoadedModel` (byoc.serving.backends.loaded; a mapping, as users' code reads it:
docs/serving.md): `backend`, `model`, `tokenizer`, `encode(inputs)`, `logits(feeds)` (one padded batch of
numpy arrays -> fp32 numpy logits), `windows`, `id2label`, `task`, `activation` (a cross-encoder's, which
CrossEncoder.predict applies to its logits: byoc.tasks.cross_encoder_activation; None for any other
model), `max_length`, `pad_id`, `passes` (how predict_fn cuts and pads a batch: byoc.serving.backends.passes),
`device`, `precision`, and the task's own facts (`Head.serving_facts`: a multi-label model's `threshold`
and `thresholds`, a token classifier's `aggregation`, a pair model's `pairs`...).

torch and transformers are imported only inside `load_torch`: the ONNX Runtime path never pays
for them (5-17 s on a GPU host).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any, cast

import numpy as np
from tokenizers import Tokenizer

from byoc import compat, model_folder, tasks
from byoc.onnx_graph import GRAPH
from byoc.serving.backends import cuda_provider, passes
from byoc.serving.backends.backend_choice import (
    ALLOW_UNTRAINED_HEAD_ENV,
    HALF,
    BackendError,
    Host,
    Plan,
    fp16_overflow,
    torch_dtype_name,
)
from byoc.serving.backends.loaded import LoadedModel
from byoc.serving.backends.onnx_session import Session
from byoc.tasks.limits import CHARS_PER_TOKEN, cut_text  # noqa: F401  (CHARS_PER_TOKEN: as before)

logger = logging.getLogger(__name__)


def describe(model_dir: Path, gpu: bool) -> Host:
    """This host and model as backend_choice sees them. ONNX Runtime's providers are asked only on a
    GPU host (importing onnxruntime to ask costs about 0.3 s, and on the CPU changes nothing). A
    BackendError, in a sentence naming the folder, where it holds no model to load (`check_folder`)."""
    check_folder(model_dir)
    installed = importlib.util.find_spec("onnxruntime") is not None
    files = model_folder.weights_dir(model_dir)
    return Host(
        gpu=gpu,
        providers=cuda_provider.available_providers() if gpu and installed else (cuda_provider.CPU_EP,),
        onnxruntime=installed,
        graph=(files / GRAPH).exists(),
        tokenizer=(files / "tokenizer.json").exists(),
        torch=importlib.util.find_spec("torch") is not None,
        tokens=model_tokens(model_dir),
    )


def model_tokens(model_dir: Path) -> int:
    """The longest input the folder's model reads (its tokenizer's, positions' and sentence-transformers'
    limits), read from its JSON files alone: before any backend loads."""
    files = model_folder.weights_dir(model_dir)
    return model_folder.max_length(
        model_folder.json_object(files, "tokenizer_config.json").get("model_max_length"),
        model_folder.positions(model_folder.json_object(files, "config.json")),
        model_folder.json_object(files, "sentence_bert_config.json").get("max_seq_length"),
    )


def check_folder(model_dir: Path) -> None:
    """A BackendError saying what is missing where `model_dir` holds no model the loaders can read (it does
    not exist, or has no config.json or no weights: byoc.model_folder.unloadable), before a loader reads it:
    transformers would take a missing folder for a Hub repository's name and fail on that."""
    problem = model_folder.unloadable(model_folder.weights_dir(Path(model_dir)))
    if problem:
        raise BackendError(problem)


def clip(inputs: list[str | tuple[str, str]], tokens: int, side: str = "right") -> list[str | tuple[str, str]]:
    """Each text (and each half of a pair) cut to CHARS_PER_TOKEN x `tokens` characters, keeping the
    side that truncation keeps (the start, or the end when the tokenizer truncates on the left)."""
    return [cut_text(x, tokens, side) if isinstance(x, str) else tuple_cut(x, tokens, side) for x in inputs]


def tuple_cut(pair: tuple[str, str], tokens: int, side: str) -> tuple[str, str]:
    return cut_text(pair[0], tokens, side), cut_text(pair[1], tokens, side)


def load_onnx(model_dir: Path, plan: Plan, threads: int, task_name: str | None = None) -> LoadedModel:
    """The model on ONNX Runtime, its session running `threads` threads (`inference_threads`); `task_name`:
    the task asked for (BYOC_TASK), else the folder's (byoc.tasks.of_folder)."""
    check_folder(model_dir)
    files = model_folder.weights_dir(model_dir)  # (an inference-free sparse model's document transformer)
    config = json.loads((files / "config.json").read_text(encoding="utf-8"))
    task = tasks.of_folder(model_dir, config, task_name)
    facts = task.head.serving_facts(model_dir, config)
    tokenizer_config_path = files / "tokenizer_config.json"
    tokenizer_config = (
        json.loads(tokenizer_config_path.read_text(encoding="utf-8")) if tokenizer_config_path.exists() else {}
    )
    limit = model_folder.max_length(
        tokenizer_config.get("model_max_length"), model_folder.positions(config), facts.get("max_seq_length")
    )
    limit = min(limit, plan.max_length or limit)
    tokenizer = Tokenizer.from_file(str(files / "tokenizer.json"))
    tokenizer.no_padding()  # batches are padded here, per length-sorted chunk
    # longest_first, as transformers' truncation=True, on the side the tokenizer was saved with
    side = tokenizer_config.get("truncation_side") or "right"
    tokenizer.enable_truncation(limit, direction=side)
    pad = tokenizer_config.get("pad_token") or "[PAD]"
    pad_id = tokenizer.token_to_id(pad["content"] if isinstance(pad, dict) else pad) or 0
    if plan.precision == "fp16" and not model_folder.fp16_safe(config):
        raise BackendError(fp16_overflow())
    session = Session(
        files,
        threads,
        int8=plan.precision == "int8",
        device=plan.device,
        fp16=plan.precision == "fp16",
    )
    logger.info(
        "model runs on ONNX Runtime (%s, %s, %s, %d threads)", GRAPH, plan.precision, session.provider, session.threads
    )

    sides = {side: tokenizer}  # the tokenizer truncating on each side a request asks for (truncation_direction)
    special = bool(facts.get("special_tokens", True))  # (a generative reranker's template holds its own)

    def encode(inputs: list[str | tuple[str, str]], direction: str | None = None) -> list[dict[str, list[int]]]:
        cut = direction or side
        if cut not in sides:  # (a copy of its own, set before it is shared: the others' is never changed)
            copy = Tokenizer.from_str(tokenizer.to_str())
            copy.enable_truncation(limit, direction=cut)
            sides[cut] = copy
        return [
            {"input_ids": e.ids, "attention_mask": e.attention_mask, "token_type_ids": e.type_ids}
            for e in sides[cut].encode_batch(clip(inputs, limit, cut), add_special_tokens=special)
        ]

    return LoadedModel.of(
        task,
        facts,
        backend="onnxruntime",
        model=session,
        tokenizer=tokenizer,
        encode=encode,
        logits=session.logits,
        windows=task.head.window_encoder(tokenizer, limit, session.inputs),
        id2label=labels_of(config),
        activation=tasks.cross_encoder_activation(model_dir, config),
        max_length=limit,
        pad_id=pad_id,
        passes=passes.gpu(limit) if plan.device == "cuda" else passes.CPU,
        device=plan.device,
        precision=plan.precision,
    )


def labels_of(config: dict[str, Any]) -> dict[int, str]:
    """The label names config.json gives; transformers' LABEL_i where it gives only their number."""
    if config.get("id2label"):
        return {int(k): v for k, v in config["id2label"].items()}
    return {i: f"LABEL_{i}" for i in range(int(config.get("num_labels") or 2))}


def load_torch(
    model_dir: Path,
    plan: Plan,
    compiled: bool = False,
    untrained_head: bool = False,
    task_name: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """The model on torch. A folder that ships code of its own (auto_map) runs it only with `trust_remote_code`
    (BYOC_TRUST_REMOTE_CODE), from the folder alone: refused otherwise, before transformers reads it."""
    check_folder(model_dir)
    problem = model_folder.code_problem(
        model_folder.weights_dir(model_dir), trust_remote_code, "BYOC_TRUST_REMOTE_CODE=true"
    )
    if problem:
        raise BackendError(f"{model_dir}: {problem} (or serve its model.onnx: `byoc export-onnx`, no code runs then)")
    if GRAPH in plan.why and not (model_folder.weights_dir(model_dir) / GRAPH).exists():  # torch: no graph
        logger.info(export_hint(model_dir))
    # Imported only here: the ONNX Runtime path starts in about a second because it never imports them.
    try:
        import torch
        from transformers import AutoTokenizer
    except ModuleNotFoundError as err:
        if err.name not in ("torch", "transformers"):
            raise
        raise BackendError(needs_full_image(plan, err.name)) from None

    files = model_folder.weights_dir(model_dir)  # (as load_onnx)
    tokenizer = AutoTokenizer.from_pretrained(files, trust_remote_code=trust_remote_code)
    config = json.loads((files / "config.json").read_text(encoding="utf-8"))
    unsupported = compat.unsupported_architecture(config)
    if unsupported:
        raise BackendError(unsupported)
    task = tasks.of_folder(model_dir, config, task_name)
    facts = task.head.serving_facts(model_dir, config)
    activation = tasks.cross_encoder_activation(model_dir, config)
    model, missing = task.load_torch(
        files, use_safetensors=True, trust_remote_code=trust_remote_code, **compat.fp32_weights()
    )
    if missing and not untrained_head:
        raise BackendError(untrained_head_message(model_dir, sorted(missing)))
    module = task.output_module(model, model_dir)
    problem = task.tokenizer_problem(bool(getattr(tokenizer, "is_fast", False)))
    if problem:
        raise BackendError(f"{problem}: {model_dir}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = plan.precision
    if precision == HALF and device.type == "cpu":  # /dev/nvidia0 is there, and torch sees no CUDA
        logger.warning("an NVIDIA device is present but torch sees no CUDA GPU: serving on the CPU, fp32")
        precision = "fp32"
    bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
    dtype = getattr(torch, torch_dtype_name(precision, bf16, model_folder.fp16_safe(config)))
    module.to(device=device, dtype=dtype).eval()
    positions = model_folder.positions(model.config)
    limit = model_folder.max_length(tokenizer.model_max_length, positions, facts.get("max_seq_length"))
    limit = min(limit, plan.max_length or limit)
    names = [n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]
    backend = getattr(tokenizer, "backend_tokenizer", None)  # (a slow tokenizer has none: no task windows it)
    windows = task.head.window_encoder(backend, limit, names) if backend is not None else None
    shapes = passes.gpu(limit) if device.type == "cuda" else passes.CPU
    forward: Any = module
    if compiled:
        forward = _compile(torch, module, device.type, shapes)
    logger.info(
        "model runs on torch %s (%s, %s%s, %d threads)",
        torch.__version__,
        device,
        str(dtype).removeprefix("torch."),
        ", compiled per shape" if compiled else "",
        torch.get_num_threads(),
    )

    def encode(inputs: list[str | tuple[str, str]], direction: str | None = None) -> list[dict[str, list[int]]]:
        return encode_with(tokenizer, inputs, limit, direction, bool(facts.get("special_tokens", True)))

    def logits(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = forward(**{k: torch.from_numpy(v).to(device) for k, v in feeds.items()})
            return out.float().cpu().numpy()  # half precision inside, fp32 answers

    return LoadedModel.of(
        task,
        facts,
        backend="torch",
        model=model,
        tokenizer=tokenizer,
        encode=encode,
        logits=logits,
        windows=windows,
        id2label=dict(model.config.id2label),
        activation=activation,
        max_length=limit,
        pad_id=tokenizer.pad_token_id or 0,
        passes=shapes,
        device=device.type,
        precision=str(dtype).removeprefix("torch."),
    )


def untrained_head_message(model_dir: Path, missing: list[str]) -> str:
    """What to say of a folder whose weights lack part of the model (a classification head, mostly)."""
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    return (
        f"{model_dir} has no trained classification head: its weights lack {shown}, which would be initialised "
        "at random, so every answer would be noise. For its sentence vectors, serve it as an embedding model "
        f"({TASK_HINT}); for a classifier, fine-tune it with `byoc train` (the job writes a model with its head), "
        f"or set {ALLOW_UNTRAINED_HEAD_ENV}=true to serve it anyway."
    )


TASK_HINT = (
    "BYOC_TASK=embedding; a sentence-transformers folder of an embedding model, with modules.json, is one "
    "unless BYOC_TASK says"
)


def export_hint(model_dir: Path) -> str:
    """What to do about a folder served on torch only because it has no serving graph."""
    return (
        f"{model_dir} has no {GRAPH}, so torch serves it: importing torch and transformers adds seconds to every "
        f"start (ONNX Runtime starts in about one, without them). Write the graph with `byoc export-onnx {model_dir}` "
        "and ship it beside the weights in model.tar.gz"
    )


def needs_full_image(plan: Plan, missing: str) -> str:
    """Why this model cannot be served here: it needs torch, and this is the serving image, which has none."""
    return (
        f"this model is served on torch ({plan.why}), and this image has no {missing}: the serving image "
        "(Dockerfile.serve) serves models that carry model.onnx, on ONNX Runtime. Serve it with a full image, "
        "Dockerfile.gpu (`./build_and_push.sh gpu`, for CPU or GPU instances) or Dockerfile.neuron, or write its "
        "serving graph with `byoc export-onnx MODEL_DIR` where torch is installed"
    )


def _compile(torch: Any, model: Any, device: str, plan: passes.PassPlan) -> Any:
    """torch.compile with one static graph per bucket shape, captured as a CUDA graph on a GPU
    (mode reduce-overhead). Each shape compiles on its first batch (seconds each): off unless
    BYOC_INFERENCE_COMPILE=1, since it costs the first requests of each shape that time."""
    # Only when compiling (BYOC_INFERENCE_COMPILE=1): dynamo's import alone takes seconds.
    import torch._dynamo

    config = torch._dynamo.config
    wanted = len(plan.all()) + 8 if plan.bucketed else 64
    for name in ("recompile_limit", "cache_size_limit"):  # the name differs across torch 2.9-2.13
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), wanted))
    return torch.compile(model, mode="reduce-overhead" if device == "cuda" else None, dynamic=False)


def encode_with(
    tokenizer: Any,
    inputs: list[str | tuple[str, str]],
    limit: int | None,
    direction: str | None = None,
    special_tokens: bool = True,
) -> list[dict[str, list[int]]]:
    """Unpadded encodings, in input order; single texts and pairs are tokenized apart; cut at `limit` on the
    tokenizer's side, or on `direction` (a request's truncation_direction: a shallow copy that says so, the
    backend tokenizer being set for every call by transformers); the tokenizer's special tokens added unless
    `special_tokens` is False (a text a chat template rendered holds its own)."""
    if direction and direction != getattr(tokenizer, "truncation_side", "right"):
        tokenizer = copy.copy(tokenizer)
        tokenizer.truncation_side = direction
    if limit is not None:
        inputs = clip(inputs, limit, getattr(tokenizer, "truncation_side", "right"))
    encoded: list[dict[str, list[int]] | None] = [None] * len(inputs)
    singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
    for rows, args in (
        (singles, ([inputs[i] for i in singles],)),
        (pairs, ([inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs])),
    ):
        if rows:
            enc = tokenizer(*args, truncation=True, max_length=limit, add_special_tokens=special_tokens)
            for n, i in enumerate(rows):
                encoded[i] = {key: values[n] for key, values in enc.items()}
    return cast(list[dict[str, list[int]]], encoded)  # every index is a single text or a pair: all filled
