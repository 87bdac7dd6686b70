"""The default inference handlers: a text classifier trained by `byoc train`.

SageMaker's handler contract (as in the AWS inference toolkits): `model_fn(model_dir)`,
`input_fn(body, content_type)`, `predict_fn(data, model)`, `output_fn(prediction, accept)`.
`byoc serve` uses these unless the model's `code/inference.py` defines its own; every trained
model carries the template `code/inference.py`, which imports them from here and overrides one.

Request and response follow the Hugging Face inference DLC, so existing clients keep working:
    {"inputs": "text" | ["t1", ...] | [{"text": ..., "text_pair": ...}], "parameters": {"top_k": 2}}
    -> [{"label": "joy", "score": 0.98}]  (one entry per input; a list per input with top_k)
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
from tokenizers import Tokenizer

from byoc import negotiation
from byoc.onnx_graph import GRAPH, Session
from byoc.request_errors import InputError, NotAcceptable, UnsupportedMediaType

MAX_BATCH = 64  # texts run through the model at once; larger requests are split
TOKEN_BUDGET = 256  # padded tokens per forward pass (batch size x its longest text): small batches pad least
JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/jsonl")
CONTENT_TYPES = ("application/json", "text/csv", "text/plain", *JSON_LINES)
ACCEPT_TYPES = ("application/json", "text/csv", *JSON_LINES)
BACKEND_ENV = "BYOC_INFERENCE_BACKEND"  # auto (default), onnxruntime or torch
PRECISION_ENV = "BYOC_INFERENCE_PRECISION"  # fp32 (default) or int8 (ONNX Runtime only; faster, less accurate)

logger = logging.getLogger("byoc.inference")


def model_fn(model_dir: str) -> dict[str, Any]:
    """Load tokenizer and classifier; weights come from safetensors only (nothing is unpickled).

    Runs on ONNX Runtime where the model has its serving graph (`model.onnx`, written by `byoc
    train`) and no NVIDIA GPU is present, or int8 was asked for (ONNX Runtime's int8 runs on the
    CPU, on any instance): torch and transformers are then never imported, which starts several
    times faster. Otherwise (or with BYOC_INFERENCE_BACKEND=torch) on transformers.
    Either way the result has the same keys; `logits(feeds)` runs one padded batch of numpy arrays.
    """
    folder = Path(model_dir)
    wanted, int8 = _wanted_backend(), _int8()
    backend = choose_backend(folder, int8=int8)
    if int8 and backend != "onnxruntime":
        raise ValueError(
            f"{PRECISION_ENV}=int8 needs the ONNX Runtime backend, and this model is served by torch "
            f"(model.onnx, tokenizer.json or onnxruntime missing, or {BACKEND_ENV}=torch)"
        )
    if backend == "onnxruntime":
        try:
            return _load_onnx(folder, int8)
        except RuntimeError as err:  # byoc.onnx_graph.GraphError: a stale graph is never used
            if int8 or wanted == "onnxruntime":
                raise
            logger.warning("serving with torch instead of ONNX Runtime: %s", err)
    return _load_torch(folder)


def _wanted_backend() -> str:
    wanted = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "onnxruntime", "torch"):
        raise ValueError(f"{BACKEND_ENV}={wanted!r}: use auto, onnxruntime or torch")
    return wanted


def inference_threads() -> int:
    """Threads one worker's model may use: OMP_NUM_THREADS (the server sets it to cores / workers)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return os.cpu_count() or 1


def nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists()  # without importing torch (seconds) to ask


def choose_backend(model_dir: Path, int8: bool = False, gpu: bool | None = None) -> str:
    """onnxruntime or torch for this model; `gpu` (default: whether an NVIDIA GPU is present)."""
    wanted = _wanted_backend()
    missing = [
        what
        for what, ok in (
            ("model.onnx (the serving graph byoc train writes)", (model_dir / "model.onnx").exists()),
            ("tokenizer.json (a fast tokenizer)", (model_dir / "tokenizer.json").exists()),
            ("the onnxruntime package", importlib.util.find_spec("onnxruntime") is not None),
        )
        if not ok
    ]
    if wanted == "onnxruntime" and missing:
        raise ValueError(
            f"{BACKEND_ENV}=onnxruntime but {' and '.join(missing)} is missing; unset it to serve with torch"
        )
    if wanted == "auto":
        # ONNX Runtime here is the CPU build: on a GPU fp32 stays with torch (CUDA), but an explicit
        # int8 is a request for ONNX Runtime's int8 on the CPU, honoured on any instance.
        gpu = nvidia_gpu() if gpu is None else gpu
        return "onnxruntime" if not missing and (int8 or not gpu) else "torch"
    return wanted


def _int8() -> bool:
    precision = os.environ.get(PRECISION_ENV, "fp32").strip().lower() or "fp32"
    if precision not in ("fp32", "int8"):
        raise ValueError(f"{PRECISION_ENV}={precision!r}: use fp32 or int8")
    return precision == "int8"


def _max_length(*limits: Any) -> int:
    """Truncate to what both the tokenizer and the model's position table allow."""
    return min((n for n in limits if isinstance(n, int) and 0 < n < 100_000), default=512)


def _load_onnx(model_dir: Path, int8: bool = False) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    tokenizer_config_path = model_dir / "tokenizer_config.json"
    tokenizer_config = (
        json.loads(tokenizer_config_path.read_text(encoding="utf-8")) if tokenizer_config_path.exists() else {}
    )
    max_length = _max_length(tokenizer_config.get("model_max_length"), config.get("max_position_embeddings"))
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # batches are padded here, per length-sorted chunk
    # longest_first, as transformers' truncation=True, on the side the tokenizer was saved with
    tokenizer.enable_truncation(max_length, direction=tokenizer_config.get("truncation_side") or "right")
    pad = tokenizer_config.get("pad_token") or "[PAD]"
    pad_id = tokenizer.token_to_id(pad["content"] if isinstance(pad, dict) else pad) or 0
    session = Session(model_dir, inference_threads(), int8=int8)
    logger.info("model runs on ONNX Runtime (%s%s, %d threads)", GRAPH, ", int8" if int8 else "", session.threads)

    def encode(inputs: list[str | tuple[str, str]]) -> list[dict[str, list[int]]]:
        return [
            {"input_ids": e.ids, "attention_mask": e.attention_mask, "token_type_ids": e.type_ids}
            for e in tokenizer.encode_batch(inputs)
        ]

    return {
        "backend": "onnxruntime",
        "model": session,
        "tokenizer": tokenizer,
        "encode": encode,
        "logits": session.logits,
        "id2label": {int(k): v for k, v in config["id2label"].items()},
        "max_length": max_length,
        "pad_id": pad_id,
    }


def _load_torch(model_dir: Path) -> dict[str, Any]:
    # Imported only here: the ONNX Runtime path starts in about a second because it never imports them.
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True, trust_remote_code=False)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    max_length = _max_length(tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None))
    logger.info("model runs on torch %s (%s, %d threads)", torch.__version__, device, torch.get_num_threads())

    def encode(inputs: list[str | tuple[str, str]]) -> list[dict[str, list[int]]]:
        return _encode(tokenizer, inputs, max_length)

    def logits(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v).to(device) for k, v in feeds.items()}).logits.float().cpu().numpy()

    return {
        "backend": "torch",
        "model": model,
        "tokenizer": tokenizer,
        "encode": encode,
        "logits": logits,
        "id2label": dict(model.config.id2label),
        "max_length": max_length,
        "pad_id": tokenizer.pad_token_id or 0,
    }


def input_fn(body: bytes | str, content_type: str = "application/json") -> dict[str, Any]:
    """Parse a request into {"inputs": [text or (text, text_pair)], "parameters": {...}}.

    Everything a model could choke on is refused here, with a 4xx naming the input, before the
    request can join a batch with other clients' requests."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind not in CONTENT_TYPES:
        raise UnsupportedMediaType(f"unsupported content type {content_type!r}: send one of {', '.join(CONTENT_TYPES)}")
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    except UnicodeDecodeError as err:
        line = cast(bytes, body)[: err.start].count(b"\n") + 1
        raise InputError(f"the body is not UTF-8 text (byte {err.start}, line {line})") from None
    if not text.strip():
        raise InputError('the body is empty: send {"inputs": "a text"} or a list of texts')
    try:
        inputs, parameters = _parse(text, kind)
    except RecursionError:
        raise InputError("the body is nested too deeply") from None
    if not isinstance(parameters, dict):
        raise InputError('"parameters" must be a JSON object')
    _check_top_k(parameters.get("top_k"))
    return {"inputs": _normalise(inputs), "parameters": parameters}


def _parse(text: str, kind: str) -> tuple[Any, Any]:
    if kind == "application/json":
        try:
            payload = json.loads(text)
        except ValueError as err:  # JSONDecodeError, and integers too long to convert
            raise InputError(f"the body is not valid JSON: {err}") from None
        if isinstance(payload, dict) and "inputs" in payload:
            return payload["inputs"], payload.get("parameters") or {}
        return payload, {}
    if kind in JSON_LINES:
        return [_jsonline(line) for line in text.split("\n") if line.strip()], {}
    if kind == "text/csv":
        try:
            return [row if len(row) > 1 else row[0] for row in csv.reader(io.StringIO(text)) if row], {}
        except csv.Error as err:  # a field over csv's size limit, a quote left open
            raise InputError(f"the body is not valid CSV: {err}") from None
    return [line for line in text.split("\n") if line.strip()], {}  # text/plain: one text per line


def _jsonline(line: str) -> Any:
    try:
        value = json.loads(line)
    except ValueError as err:
        raise InputError(f"a JSON Lines record is not valid JSON: {err}") from None
    return value.get("inputs", value) if isinstance(value, dict) and "inputs" in value else value


def _check_top_k(top_k: Any) -> None:
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise InputError('"top_k" must be a positive integer')


def _normalise(inputs: Any) -> list[str | tuple[str, str]]:
    items = inputs if isinstance(inputs, list) else [inputs]
    if not items:
        raise InputError('"inputs" is empty: send a text or a list of texts')
    out: list[str | tuple[str, str]] = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            pair = item.get("text_pair")
            out.append((item["text"], pair) if isinstance(pair, str) else item["text"])
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(t, str) for t in item):
            out.append((item[0], item[1]))
        elif isinstance(item, str):
            out.append(item)
        else:
            raise InputError(
                f'input {index}: each input must be a string, [text, text_pair] or {{"text": ..., "text_pair": ...}}'
            )
        last = out[-1]
        if not (_encodable(last) if isinstance(last, str) else _encodable(last[0]) and _encodable(last[1])):
            raise InputError(f"input {index} is not valid Unicode text (a lone surrogate such as \\ud800)")
    return out


def _encodable(text: str) -> bool:
    """Whether the text is valid Unicode, as the tokenizer needs: JSON's \\ud800 escapes make strings
    that are not (lone surrogates). ASCII, nearly every text, is checked in C without a copy."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    """Classify; returns, per input, the best {"label", "score"} or the top_k of them."""
    inputs, parameters = data["inputs"], data.get("parameters", {})
    top_k = parameters.get("top_k")
    _check_top_k(top_k)
    try:
        encoded = model["encode"](inputs)
    except Exception:  # a user's input_fn let through what the tokenizer cannot take: the input's fault
        _normalise(inputs)  # raises InputError naming it, if that is the cause
        raise
    # Shortest first, cut into batches of a bounded padded size: each batch pads only to its own
    # longest text (tweets of 5 and 60 tokens never share one); answers go back in request order.
    order = sorted(range(len(inputs)), key=lambda i: len(encoded[i]["input_ids"]))
    scores: list[Any] = [None] * len(inputs)  # each input's probabilities, filled chunk by chunk
    for chunk in _batches(order, encoded):
        probs = _softmax(model["logits"](_pad(chunk, encoded, model["pad_id"])))
        for n, i in enumerate(chunk):
            scores[i] = probs[n]
    id2label = model["id2label"]
    results: list[Any] = []
    for row in scores:
        best = np.argsort(-row, kind="stable")[: top_k or 1]
        entries = [{"label": id2label[int(j)], "score": float(row[j])} for j in best]
        results.append(entries if top_k else entries[0])
    return results


# The server may merge concurrent requests into one call: this predict_fn takes
# {"inputs": [...], "parameters": {...}} and returns one result per input, in order
# (byoc.handlers.Handlers.batchable reads this flag).
predict_fn.batchable = True  # type: ignore[attr-defined]


def _encode(tokenizer: Any, inputs: list[str | tuple[str, str]], max_length: int | None) -> list[dict[str, list[int]]]:
    """Unpadded encodings, in input order; single texts and pairs are tokenized apart."""
    encoded: list[dict[str, list[int]] | None] = [None] * len(inputs)
    singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
    for rows, args in (
        (singles, ([inputs[i] for i in singles],)),
        (pairs, ([inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs])),
    ):
        if rows:
            enc = tokenizer(*args, truncation=True, max_length=max_length)
            for n, i in enumerate(rows):
                encoded[i] = {key: values[n] for key, values in enc.items()}
    return cast(list[dict[str, list[int]]], encoded)  # every index is a single text or a pair: all filled


def _batches(order: list[int], encoded: list[dict[str, list[int]]]) -> list[list[int]]:
    """Consecutive (length-sorted) rows while batch size x longest stays within TOKEN_BUDGET."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        length = len(encoded[i]["input_ids"])
        if current and ((len(current) + 1) * length > TOKEN_BUDGET or len(current) >= MAX_BATCH):
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def _pad(rows: list[int], encoded: list[dict[str, list[int]]], pad_id: int) -> dict[str, np.ndarray]:
    width = max(len(encoded[i]["input_ids"]) for i in rows)
    batch = {
        key: np.full((len(rows), width), pad_id if key == "input_ids" else 0, dtype=np.int64)
        for key in encoded[rows[0]]
    }
    for row, i in enumerate(rows):
        for key, values in encoded[i].items():
            batch[key][row, : len(values)] = values
    return batch


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def output_fn(prediction: list[Any], accept: str = "application/json") -> tuple[str, str]:
    """Serialise as JSON (default), JSON Lines or CSV (label,score per line). `accept` is the type
    the server chose (byoc.negotiation); a full Accept header (lists, weights, wildcards) works too."""
    kind = accept if accept in ACCEPT_TYPES else negotiation.choose(accept, ACCEPT_TYPES, "application/json")
    if kind == "application/json":
        return json.dumps(prediction), "application/json"
    if kind in JSON_LINES:
        return "\n".join(json.dumps(p) for p in prediction) + "\n", kind
    if kind == "text/csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for p in prediction:
            best = p[0] if isinstance(p, list) else p
            writer.writerow([best["label"], f"{best['score']:.6f}"])
        return out.getvalue(), "text/csv"
    raise NotAcceptable(f"unsupported accept type {accept!r}: ask for one of {', '.join(ACCEPT_TYPES)}")
