"""Every writer of answers, each by the kinds it writes (byoc.tasks.kinds.Kind; `WRITERS`), never by the task
that gave them.

The default predict_fn returns `Answers`: a list, one answer an input, that says its kind; the batcher keeps
the kind when it splits a merged batch's answers back into requests. A user's own predict_fn may return
`Answers(answers, Kind.VECTOR)` too; a plain list (the answers of code written before kinds existed) has its
kind read from its contents, here alone (`read_kind`).

- JSON and JSON Lines (byoc.serving.default_pipeline.output_fn): any kind, as it is;
- CSV (`csv_text`): one line an input, a vector's components or (label or index, score) pairs; a 406 naming
  any other kind;
- a body's own shape, once its inputs' answers are back (`shaped`; a batch may have merged them with other
  requests'): TEI's rerank list (`rerank`: [{"index", "score"(, "text")}], best first, at most `top_n`) and
  OpenAI's embeddings object (`openai`: {"object": "list", "data": [{"object": "embedding", "index",
  "embedding"}], "model", "usage"}; `encoding_format` base64: each vector's float32 bytes, little-endian,
  base64-encoded, as OpenAI's clients decode them);
- the client routes' answers (byoc.serving.protocol.clients rewrites their requests): TEI's /predict
  (`tei_predict`: every label's score, best first) and Cohere's rerank (`cohere`: {"id", "results": [{"index",
  "relevance_score"(, "document")}], "meta"}, from TEI's rerank list).

`cells` counts the numbers an answer holds, which decides where it is written and whether it is too large.
"""

from __future__ import annotations

import base64
import csv
import io
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.serving.protocol.request_errors import NON_FINITE, InvalidAnswer, NotAcceptable
from byoc.tasks.kinds import Kind

SCORED = (Kind.LABELS, Kind.NUMBER, Kind.RELEVANCE)  # a CSV row of (label or index, score) pairs
# Each writer and the kinds of answer it writes (a client route answers the kinds of its writer:
# byoc.tasks.kinds.ROUTE_KINDS, tested to agree).
WRITERS: Mapping[str, tuple[Kind, ...]] = {
    "json": tuple(Kind),
    "jsonlines": tuple(Kind),
    "csv": (Kind.VECTOR, *SCORED),
    "rerank": (Kind.RELEVANCE,),
    "openai": (Kind.VECTOR,),
    "tei_predict": (Kind.LABELS, Kind.NUMBER),
    "cohere": (Kind.RELEVANCE,),
}


class Answers(list):
    """Each input's answer, in input order, and their kind."""

    def __init__(self, answers: Iterable[Any] = (), kind: Kind | str | None = None) -> None:
        super().__init__(answers)
        self.kind = Kind(kind) if kind is not None else None


def kind_of(prediction: Any) -> Kind | None:
    """The kind an answer says (`Answers`), else None: read from each answer's contents (`read_kind`)."""
    said = getattr(prediction, "kind", None)
    return Kind(said) if said is not None else None


def read_kind(answer: Any) -> Kind | None:
    """One answer's kind from its contents, for a predict_fn's plain list: a list of numbers is a vector;
    entries with offsets are entities; entries with an index and a score relevance; with a score, labels (or a
    number); None for anything else (a CSV row cannot hold it)."""
    if _is_vector(answer):
        return Kind.VECTOR
    entries = answer if isinstance(answer, list) else [answer]
    if any(isinstance(e, dict) and "start" in e for e in entries):
        return Kind.ENTITIES
    if all(isinstance(e, dict) and "score" in e for e in entries):
        return Kind.RELEVANCE if any("index" in e for e in entries) else Kind.LABELS
    return None


def csv_text(prediction: list[Any]) -> str:
    """One CSV line an input: a vector's components; (label or index, score) pairs in turn for labels, a number
    or relevance (an empty field for an input with no label); a 406 naming the kind for any other."""
    said = kind_of(prediction)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for answer in prediction:
        kind = said or read_kind(answer)
        if kind not in WRITERS["csv"]:
            raise NotAcceptable(
                f"this answer ({kind.described if kind else 'entries without a score'}) does not fit a CSV row: "
                "ask for application/json or application/jsonlines"
            )
        if kind == Kind.VECTOR:
            if not all(math.isfinite(v) for v in answer):
                raise InvalidAnswer(NON_FINITE)
            writer.writerow([f"{v:.9g}" for v in answer])
        else:  # (labels, a number, relevance)
            writer.writerow(_scored_row(answer) or [""])  # one line per input, also for an input with no label
    return out.getvalue()


def _scored_row(answer: Any) -> list[str]:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):  # a pair's relevance, unshaped
        answer = {"score": float(answer)}
    entries = answer if isinstance(answer, list) else [answer]
    if any(not isinstance(e, dict) or "score" not in e for e in entries):
        raise NotAcceptable(
            "this answer has entries without a score, which a CSV row cannot hold: ask for application/json"
        )
    if any(not math.isfinite(e["score"]) for e in entries):
        raise InvalidAnswer(NON_FINITE)
    return [
        field for e in entries for field in (*(str(e[k]) for k in ("label", "index") if k in e), f"{e['score']:.6f}")
    ]


def _is_vector(answer: Any) -> bool:
    return (
        isinstance(answer, list)
        and bool(answer)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in answer)
    )


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


def tei_predict(answers: list[Any], single: bool) -> Any:
    """TEI's /predict answer: each input's labels (every label's score, best first, as the default predict_fn
    gives them with top_k) as a list, a single input's (`single`: the request sent one) as that list alone."""
    listed = [answer if isinstance(answer, list) else [answer] for answer in answers]
    return listed[0] if single else listed


def cohere(ranked: list[dict[str, Any]], version: int, returned: bool, model: Any) -> dict[str, Any]:
    """Cohere's rerank answer (`version` 1 or 2) from TEI's rerank list (`rerank`'s): each document's index and
    relevance score, best first, with its text where the request asked for it (`returned`); `model`: the name
    the request gave."""
    results = [
        {
            "index": entry["index"],
            "relevance_score": entry["score"],
            **({"document": {"text": entry["text"]}} if returned else {}),
        }
        for entry in ranked
    ]
    meta = {"api_version": {"version": str(version)}, "billed_units": {"search_units": 1}}
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta, "model": model}


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
