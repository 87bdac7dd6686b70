"""Default inference handlers for a text classifier trained by `byoc train`.

SageMaker's handler contract (as in the AWS inference toolkits): `model_fn(model_dir)`,
`input_fn(body, content_type)`, `predict_fn(data, model)`, `output_fn(prediction, accept)`.
Every trained model carries a copy of this file as `model/code/inference.py`; copy it, change
any of the four functions, and keep the rest.

Request and response follow the Hugging Face inference DLC, so existing clients keep working:
    {"inputs": "text" | ["t1", ...] | [{"text": ..., "text_pair": ...}], "parameters": {"top_k": 2}}
    -> [{"label": "joy", "score": 0.98}]  (one entry per input; a list per input with top_k)
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from byoc.handlers import InputError, NotAcceptable, UnsupportedMediaType

MAX_BATCH = 64  # texts run through the model at once; larger requests are split
TOKEN_BUDGET = 256  # padded tokens per forward pass (batch size x its longest text): small batches pad least
JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/jsonl")
CONTENT_TYPES = ("application/json", "text/csv", "text/plain", *JSON_LINES)
ACCEPT_TYPES = ("application/json", "text/csv", *JSON_LINES)


def model_fn(model_dir: str) -> dict[str, Any]:
    """Load tokenizer and classifier. Weights load from safetensors only (nothing is unpickled)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True, trust_remote_code=False)
    model.eval()
    # Truncate to what both the tokenizer and the model's position table allow.
    limits = [n for n in (tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None))
              if isinstance(n, int) and 0 < n < 100_000]
    return {"model": model, "tokenizer": tokenizer, "max_length": min(limits, default=512)}


def input_fn(body: bytes | str, content_type: str = "application/json") -> dict[str, Any]:
    """Parse a request into {"inputs": [text or (text, text_pair)], "parameters": {...}}."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind not in CONTENT_TYPES:
        raise UnsupportedMediaType(f"unsupported content type {content_type!r}: send one of {', '.join(CONTENT_TYPES)}")
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    except UnicodeDecodeError:
        raise InputError("the body is not UTF-8 text") from None
    if not text.strip():
        raise InputError("the body is empty: send {\"inputs\": \"a text\"} or a list of texts")
    if kind == "application/json":
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"the body is not valid JSON: {err}") from None
        if isinstance(payload, dict) and "inputs" in payload:
            inputs, parameters = payload["inputs"], payload.get("parameters") or {}
        else:
            inputs, parameters = payload, {}
    elif kind in JSON_LINES:
        inputs, parameters = [_jsonline(line) for line in text.split("\n") if line.strip()], {}
    elif kind == "text/csv":
        inputs, parameters = [row if len(row) > 1 else row[0] for row in csv.reader(io.StringIO(text)) if row], {}
    else:  # text/plain: one text per line
        inputs, parameters = [line for line in text.split("\n") if line.strip()], {}
    if not isinstance(parameters, dict):
        raise InputError('"parameters" must be a JSON object')
    return {"inputs": _normalise(inputs), "parameters": parameters}


def _jsonline(line: str) -> Any:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"a JSON Lines record is not valid JSON: {err}") from None
    return value.get("inputs", value) if isinstance(value, dict) and "inputs" in value else value


def _normalise(inputs: Any) -> list[str | tuple[str, str]]:
    items = inputs if isinstance(inputs, list) else [inputs]
    if not items:
        raise InputError('"inputs" is empty: send a text or a list of texts')
    out: list[str | tuple[str, str]] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            pair = item.get("text_pair")
            out.append((item["text"], pair) if isinstance(pair, str) else item["text"])
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(t, str) for t in item):
            out.append((item[0], item[1]))
        elif isinstance(item, str):
            out.append(item)
        else:
            raise InputError('each input must be a string, [text, text_pair] or {"text": ..., "text_pair": ...}')
    return out


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    """Classify; returns, per input, the best {"label", "score"} or the top_k of them."""
    tokenizer, classifier = model["tokenizer"], model["model"]
    inputs, parameters = data["inputs"], data.get("parameters", {})
    top_k = parameters.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise InputError('"top_k" must be a positive integer')
    encoded = _encode(tokenizer, inputs, model.get("max_length"))
    # Shortest first, cut into batches of a bounded padded size: each batch pads only to its own
    # longest text (tweets of 5 and 60 tokens never share one); answers go back in request order.
    order = sorted(range(len(inputs)), key=lambda i: len(encoded[i]["input_ids"]))
    scores: list[torch.Tensor | None] = [None] * len(inputs)
    with torch.inference_mode():
        for chunk in _batches(order, encoded):
            probs = classifier(**_pad(chunk, encoded, tokenizer.pad_token_id or 0)).logits.float().softmax(dim=-1)
            for row, i in enumerate(chunk):
                scores[i] = probs[row]
    id2label = classifier.config.id2label
    results: list[Any] = []
    for row in scores:
        values, indices = row.topk(min(top_k or 1, row.numel()))
        entries = [{"label": id2label[int(j)], "score": float(v)} for v, j in zip(values, indices)]
        results.append(entries if top_k else entries[0])
    return results


# The server may merge concurrent requests into one call: this predict_fn takes
# {"inputs": [...], "parameters": {...}} and returns one result per input, in order.
# Keep that contract when you change it, or set this to False.
predict_fn.batchable = True


def _encode(tokenizer, inputs: list[str | tuple[str, str]], max_length: int | None) -> list[dict[str, list[int]]]:
    """Unpadded encodings, in input order; single texts and pairs are tokenized apart."""
    encoded: list[dict[str, list[int]] | None] = [None] * len(inputs)
    singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
    for rows, args in ((singles, ([inputs[i] for i in singles],)),
                       (pairs, ([inputs[i][0] for i in pairs], [inputs[i][1] for i in pairs]))):
        if rows:
            enc = tokenizer(*args, truncation=True, max_length=max_length)
            for n, i in enumerate(rows):
                encoded[i] = {key: values[n] for key, values in enc.items()}
    return encoded


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


def _pad(rows: list[int], encoded: list[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(encoded[i]["input_ids"]) for i in rows)
    batch = {key: torch.full((len(rows), width), pad_id if key == "input_ids" else 0, dtype=torch.long)
             for key in encoded[rows[0]]}
    for row, i in enumerate(rows):
        for key, values in encoded[i].items():
            batch[key][row, :len(values)] = torch.tensor(values)
    return batch


def output_fn(prediction: list[Any], accept: str = "application/json") -> tuple[str, str]:
    """Serialise as JSON (default), JSON Lines or CSV (label,score per line)."""
    kind = (accept or "application/json").split(";")[0].strip().lower()
    if kind in ("application/json", "*/*"):
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
