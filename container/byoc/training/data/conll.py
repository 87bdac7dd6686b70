"""CoNLL files (`.conll`, `.iob`, `.bio`, or `.txt` that reads as one): a token and its tag per line,
whitespace-separated columns with the token first and the IOB tag last, a blank (or whitespace-only)
line between sentences, `-DOCSTART-` lines skipped. One row per sentence: `tokens`, `tags` and `line`
(the sentence's first line number, for messages)."""

from __future__ import annotations

import re

import pandas as pd

from byoc.training.data.types import DataError

# An IOB tag: O, or B-/I- and an entity type (IOB1 and IOB2 alike: byoc.training.data.tokens converts).
IOB_TAG = re.compile(r"O|[BI]-\S+")


def looks_like_conll(lines: list[str]) -> bool:
    """Whether a text file's first non-blank lines are CoNLL token lines: two or more whitespace-separated
    columns each, the same number on every line, the last an IOB tag, and some tag not O."""
    rows = [line.split() for line in lines if line.strip() and not line.startswith("-DOCSTART-")][:200]
    if not rows or len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        return False
    return all(IOB_TAG.fullmatch(r[-1]) for r in rows) and any(r[-1] != "O" for r in rows)


def read_conll(text: str, name: str) -> pd.DataFrame:
    """The sentences of a CoNLL file; a line whose column count differs from the file's is a DataError."""
    sentences: list[tuple[list[str], list[str], int]] = []
    tokens: list[str] = []
    tags: list[str] = []
    columns, start = None, 0
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("-DOCSTART-"):
            if tokens:
                sentences.append((tokens, tags, start))
            tokens, tags = [], []
            continue
        fields = line.split()
        if columns is None:
            columns = len(fields)
        if len(fields) < 2 or len(fields) != columns:
            problem = "a token without its tag" if len(fields) < 2 else f"the lines before have {columns}"
            raise DataError(
                f"{name}, line {number}: {len(fields)} column(s), {problem}. CoNLL lines hold the token first and "
                "its tag last, separated by whitespace, the same columns on every line, and a blank line between "
                "sentences."
            )
        if not tokens:
            start = number
        tokens.append(fields[0])
        tags.append(fields[-1])
    if tokens:
        sentences.append((tokens, tags, start))
    return pd.DataFrame(
        {"tokens": [s[0] for s in sentences], "tags": [s[1] for s in sentences], "line": [s[2] for s in sentences]}
    )
