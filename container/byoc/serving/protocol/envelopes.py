"""A request's answer in the shape its body asked for, once its inputs' answers are back (a batch may have
merged them with other requests'): TEI's rerank list and OpenAI's embeddings object. The inference
toolkit's shape, one answer per input, needs nothing here.

- rerank ({"query", "texts"}: byoc.serving.protocol.bodies): each text's relevance, as
  [{"index", "score"(, "text")}] sorted by score, highest first, at most `top_n`;
- OpenAI ({"input", "model"}): {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
  "model", "usage": {"prompt_tokens", "total_tokens"}}; `encoding_format` base64: each vector's float32
  bytes (little-endian), base64-encoded, as OpenAI's clients decode them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.serving.protocol.request_errors import NON_FINITE, InvalidAnswer


@dataclass(frozen=True)
class Embedded:
    """One text's answer to an OpenAI body, from the default predict_fn: its vector and the tokens it ran
    (the prompt's included), counted where the text was tokenized, on the inference thread."""

    vector: list[float]
    tokens: int


def shaped(data: Mapping[str, Any], answers: list[Any]) -> Any:
    """The request's answer from its inputs' `answers` (predict_fn's, in input order), in the shape the
    body's form asked for (`data["shape"]`, set by the default input_fn alone). Any predict_fn's answers
    are shaped: the default one's, or those of a model's own code that passes them on."""
    shape = data.get("shape")
    parameters = data.get("parameters") or {}
    if shape == "rerank":
        return rerank(data["inputs"], answers, parameters)
    if shape == "openai":
        return openai(answers, parameters)
    return answers


def rerank(pairs: list[Any], scores: list[Any], parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    for index, score in enumerate(scores):
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            raise InvalidAnswer(
                f"predict_fn answered a rerank request's pair {index} with {type(score).__name__}: a rerank "
                "request's answer is each pair's relevance, a number (the default predict_fn's, passed on)"
            )
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: equal scores keep the texts' order
    top_n = parameters.get("top_n")
    text = bool(parameters.get("return_text"))
    return [{"index": i, "score": scores[i], **({"text": pairs[i][1]} if text else {})} for i in order[:top_n]]


def openai(answers: list[Any], parameters: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's embeddings object. `answers`: each text's `Embedded` (the default predict_fn's), or its vector
    alone (a model's own predict_fn: its tokens are not known, and count 0)."""
    packed = parameters.get("encoding_format") == "base64"
    data, tokens = [], 0
    for i, answer in enumerate(answers):
        vector = answer.vector if isinstance(answer, Embedded) else answer
        tokens += answer.tokens if isinstance(answer, Embedded) else 0
        data.append({"object": "embedding", "index": i, "embedding": _base64(vector) if packed else vector})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": parameters.get("model", ""), "usage": usage}


def _base64(vector: list[float]) -> str:
    """The vector's float32 bytes, little-endian, base64-encoded; never NaN or infinity (a float answer
    refuses them in JSON: base64 must not let them through)."""
    packed = np.asarray(vector, dtype="<f4")
    if not np.isfinite(packed).all():
        raise InvalidAnswer(NON_FINITE)
    return base64.b64encode(packed.tobytes()).decode("ascii")


def cells(answer: Any) -> int:
    """The numbers an answer holds, counted from what will be written: each input's own answer (a vector, a
    text's token vectors, a hybrid model's outputs, a list of labels), not the first one's size times the count.
    A list's items are taken to be alike past the first level (a text's token vectors, all one width), so the
    count costs a step per input, not per number. What decides whether writing it may take the event loop's time
    (byoc.serving.execution.model_server), and whether it is over the server's limit."""
    if isinstance(answer, dict) and "data" in answer:  # an OpenAI envelope
        answer = answer["data"]
    if not isinstance(answer, list):
        return _values(answer)
    return max(1, sum(_values(item) for item in answer))


def _values(item: Any, depth: int = 0) -> int:
    """The numbers in one input's answer (a list's items counted alike from the second level on)."""
    if isinstance(item, Embedded):
        item = item.vector
    if isinstance(item, dict):
        return sum(_values(value, depth + 1) for value in item.values()) if depth < 2 else len(item)
    if isinstance(item, (list, tuple)):
        if not item:
            return 0
        first = item[0]
        if depth == 0 and isinstance(first, (dict, Embedded)):  # labels, entities: each counted
            return sum(_values(value, depth + 1) for value in item)
        if isinstance(first, (list, tuple, dict, np.ndarray)):  # token vectors, terms: alike
            return len(item) * max(1, _values(first, depth + 1))
        return len(item)  # a vector
    if isinstance(item, np.ndarray):
        return int(item.size)
    return 1
