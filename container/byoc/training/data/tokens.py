"""Token classification (NER) data: sentences as `tokens` with one IOB tag each, from CoNLL files or
from records with a list of tokens and a list of tags (`ner_tags`, `tags`: names, or ids with their
ClassLabel names). Tags are checked (IOB, one per token), IOB1 becomes IOB2, and the tag set comes
from train: `O` first, then each entity type's B- and I- tags.
"""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pandas as pd

from byoc.training.data.columns import explicit_column
from byoc.training.data.conll import IOB_TAG
from byoc.training.data.types import DataError, DataSpec, Source, describe_sources

logger = logging.getLogger(__name__)

TOKENS_COLUMNS = ("tokens", "words")
TAGS_COLUMNS = ("ner_tags", "tags", "ner", "labels", "label", "tag")


def is_token_data(sources: list[Source]) -> bool:
    """CoNLL files, or tables with a tokens column and a tags column."""
    return any(src.fmt == "conll" or _columns(src, None) is not None for src in sources)


def _columns(src: Source, spec: DataSpec | None) -> tuple[str, str] | None:
    """(tokens, tags) columns of a table, explicit names first; None where it has no tokens column."""
    lookup = {c.lower(): c for c in reversed(src.columns)}
    tokens = next((lookup[n] for n in TOKENS_COLUMNS if n in lookup), None)
    if spec is not None and spec.text_column:
        tokens = explicit_column(spec.text_column, "text_column", src.columns, "train", src.where)
    if tokens is None:
        return None
    tags = next((lookup[n] for n in TAGS_COLUMNS if n in lookup), None)
    if spec is not None and spec.label_column:
        tags = explicit_column(spec.label_column, "label_column", src.columns, "train", src.where)
    return (tokens, tags) if tags is not None else None


def build_tokens(
    sources: dict[str, list[Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    """Each split as a `tokens`, `tags` (tag ids) dataset, the tag names (from train) and, for the
    hold-out, one stratum per sentence (none: sentences are held out at random)."""
    parts = {role: [_sentences(src, spec, role) for src in srcs] for role, srcs in sources.items()}
    names = tag_names({tag for frame, _ in parts["train"] for tags in frame["tags"] for tag in tags})
    index = {name: i for i, name in enumerate(names)}
    features = datasets.Features(
        {"tokens": datasets.Sequence(datasets.Value("string")), "tags": datasets.Sequence(datasets.Value("int64"))}
    )
    splits = {}
    for role, ps in parts.items():
        for frame, src in ps:
            for row, tags in enumerate(frame["tags"]):
                unknown = next((t for t in tags if t not in index), None)
                if unknown is not None:
                    raise DataError(
                        f"The {role} data ({src.where}) has tag '{unknown}' at "
                        f"{_where(frame, row, tags.index(unknown))} "
                        f"that the train data does not have; known tags: {', '.join(names[:15])}. Fix that tag or add "
                        "examples of it to the train data."
                    )
        frame = pd.concat([f for f, _ in ps], ignore_index=True)
        splits[role] = datasets.Dataset.from_dict(
            {"tokens": frame["tokens"].tolist(), "tags": [[index[t] for t in tags] for tags in frame["tags"]]},
            features=features,
        )
        words = frame["tokens"].map(len)
        logger.info(
            "%s: %d sentences (%d tokens, %d entities) from %s; %d tags",
            role,
            len(frame),
            int(words.sum()),
            sum(t.startswith("B-") for tags in frame["tags"] for t in tags),
            describe_sources(sources[role]),
            len(names),
        )
    return splits, names, np.zeros(len(splits["train"]), dtype=np.int64)


def tag_names(tags: set[str]) -> list[str]:
    """O first, then each entity type's tags in turn: B-PER, I-PER, B-LOC... (by type name)."""
    types = sorted({t[2:] for t in tags if t != "O"})
    return ["O"] + [f"{bi}-{kind}" for kind in types for bi in ("B", "I")]


def _sentences(src: Source, spec: DataSpec, role: str) -> tuple[pd.DataFrame, Source]:
    """The source's sentences as `tokens`, `tags` (IOB2 names) and, for CoNLL files, `line`."""
    if src.fmt == "conll":
        frame = src.data if isinstance(src.data, pd.DataFrame) else src.data.to_pandas()
    else:
        columns = _columns(src, spec)
        if columns is None:
            raise DataError(
                f"The {role} data ({src.where}) is not token data like the train data: it needs a tokens column and "
                f"a tags column (ner_tags, tags), or CoNLL lines; columns: {', '.join(src.columns)}."
            )
        tokens, tags = columns
        data = (
            src.data.select_columns([tokens, tags]).to_pandas() if isinstance(src.data, datasets.Dataset) else src.data
        )
        names = src.class_names.get(tags)
        frame = pd.DataFrame({"tokens": data[tokens].reset_index(drop=True), "tags": data[tags].reset_index(drop=True)})
        frame["tags"] = [_tag_names(value, names, role, src.where, row) for row, value in enumerate(frame["tags"])]
        frame["tokens"] = [[str(t) for t in value] if _listlike(value) else value for value in frame["tokens"]]
    for row, (tokens, tags) in enumerate(zip(frame["tokens"], frame["tags"])):
        if not _listlike(tokens) or len(tokens) == 0:
            raise DataError(
                f"The {role} data ({src.where}) has a sentence with no tokens at {_where(frame, row)}. "
                "Remove it, or give it its tokens."
            )
        if len(tokens) != len(tags):
            raise DataError(
                f"The {role} data ({src.where}) has {len(tokens)} tokens but {len(tags)} tags at {_where(frame, row)}: "
                "every token needs one tag."
            )
        for position, tag in enumerate(tags):
            if not IOB_TAG.fullmatch(str(tag)):
                raise DataError(
                    f"The {role} data ({src.where}) has tag '{tag}' at {_where(frame, row, position)}, which is not "
                    "an IOB tag: tags are O, B-TYPE (an entity's first token) or I-TYPE (the tokens after it)."
                )
    frame = frame.assign(tags=[iob2(list(tags)) for tags in frame["tags"]])
    return frame, src


def _tag_names(value: object, names: list[str] | None, role: str, where: str, row: int) -> list[str]:
    if not _listlike(value):
        raise DataError(f"The {role} data ({where}) has tags {value!r} at row {row + 1}: give a list of tags per row.")
    items = [v.item() if isinstance(v, np.generic) else v for v in value]  # type: ignore[attr-defined]
    if names is not None:
        return [names[v] if isinstance(v, int) and 0 <= v < len(names) else str(v) for v in items]
    if any(isinstance(v, int) for v in items):
        raise DataError(
            f"The {role} data ({where}) has tag ids without their names (row {row + 1}): give the tags as names "
            "(B-PER, I-PER, O...) or save the data with a ClassLabel feature that names them."
        )
    return [str(v) for v in items]


def _listlike(value: object) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _where(frame: pd.DataFrame, row: int, position: int | None = None) -> str:
    """Where a sentence (or its token) is: a CoNLL file's line, else the row (and token) number."""
    if "line" in frame:
        return f"line {int(frame['line'].iloc[row]) + (position or 0)}"
    return f"row {row + 1}" + (f", token {position + 1}" if position is not None else "")


def iob2(tags: list[str]) -> list[str]:
    """IOB1 -> IOB2: an I- tag that starts an entity (after O or another type) becomes B-."""
    out: list[str] = []
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and (i == 0 or out[-1] == "O" or out[-1][2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
    return out
