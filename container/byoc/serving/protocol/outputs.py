"""Answers written by their kind (byoc.tasks.kinds.Kind), never by the task that gave them.

The default predict_fn returns `Answers`: a list, one answer an input, that says its kind; the batcher keeps
the kind when it splits a merged batch's answers back into requests. The CSV writer (`csv_text`) writes each
kind its own way or refuses it with a 406 that names it; JSON and JSON Lines write any kind as it is. A
user's own predict_fn may return `Answers(answers, Kind.VECTOR)` too; a plain list (the answers of code
written before kinds existed) has its kind read from its contents, here alone (`read_kind`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from typing import Any

from byoc.serving.protocol.request_errors import NON_FINITE, InvalidAnswer, NotAcceptable
from byoc.tasks.kinds import Kind

SCORED = (Kind.LABELS, Kind.NUMBER, Kind.RELEVANCE)  # a CSV row of (label or index, score) pairs


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
        if kind == Kind.VECTOR:
            if not all(math.isfinite(v) for v in answer):
                raise InvalidAnswer(NON_FINITE)
            writer.writerow([f"{v:.9g}" for v in answer])
        elif kind in SCORED:
            writer.writerow(_scored_row(answer) or [""])  # one line per input, also for an input with no label
        else:
            raise NotAcceptable(
                f"this answer ({kind.described if kind else 'entries without a score'}) does not fit a CSV row: "
                "ask for application/json or application/jsonlines"
            )
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
