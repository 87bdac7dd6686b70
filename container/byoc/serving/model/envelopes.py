"""A request's answer in the shape its body asked for, once its inputs' answers are back (a batch may have
merged them with other requests'): TEI's rerank list and OpenAI's embeddings object. The inference
toolkit's shape, one answer per input, needs nothing here.

- rerank ({"query", "texts"}: byoc.serving.model.bodies): each text's relevance, as
  [{"index", "score"(, "text")}] sorted by score, highest first, at most `top_n`;
- OpenAI ({"input", "model"}): {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
  "model", "usage": {"prompt_tokens", "total_tokens"}}; `encoding_format` base64: each vector's float32
  bytes (little-endian), base64-encoded, as OpenAI's clients decode them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np


def shaped(data: Mapping[str, Any], answers: list[Any], model: Any) -> Any:
    """The request's answer from its inputs' `answers` (the default predict_fn's, in input order)."""
    parameters = data.get("parameters") or {}
    shape = parameters.get("shape")
    if shape == "rerank":
        return rerank(data["inputs"], answers, parameters)
    if shape == "openai":
        return openai(answers, parameters, _tokens(data["inputs"], model))
    return answers


def rerank(pairs: list[Any], scores: list[float], parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: equal scores keep the texts' order
    top_n = parameters.get("top_n")
    text = bool(parameters.get("return_text"))
    return [{"index": i, "score": scores[i], **({"text": pairs[i][1]} if text else {})} for i in order[:top_n]]


def openai(vectors: list[list[float]], parameters: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    packed = parameters.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "index": i, "embedding": _base64(vector) if packed else vector}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": parameters.get("model", ""), "usage": usage}


def _base64(vector: list[float]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _tokens(inputs: list[Any], model: Any) -> int:
    """The tokens the inputs make (OpenAI's usage), counted by the model's own tokenizer where it has one."""
    encode = model.get("encode") if isinstance(model, dict) else None
    return sum(len(e["input_ids"]) for e in encode(inputs)) if encode else 0
