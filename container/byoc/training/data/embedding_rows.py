"""An embedding model's training data, in sentence-transformers' two layouts:

* rows of texts that belong together: an `anchor` (or `query`) column, a `positive` one and optionally a
  `negative` one (a hard negative: close, but wrong). Trained with the multiple-negatives ranking loss.
* sentence pairs with a score of any range (`task=embedding`, columns found as for a pair regression:
  `sentence1`, `sentence2`, `score`...). Trained with CoSENT.

Both become `text`, `text_pair` [, `text_negative`], `label` datasets: `label` is the pair's score
(float32), NaN for rows without one. The train data's layout picks the loss; an eval or test split may
have the other one (rows trained, scored pairs evaluated: the Spearman of the cosine; or the reverse).
"""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pandas as pd

from byoc import tasks
from byoc.training.data.columns import build_text, text_part, texts_of
from byoc.training.data.names import ANCHOR_COLUMNS, NEGATIVE_COLUMNS, POSITIVE_COLUMNS
from byoc.training.data.task_choice import RegressionCodec, as_scores
from byoc.training.data.types import DataError, DataSpec, Source, describe_sources

logger = logging.getLogger(__name__)


def rows_hint(task: str) -> str:
    """What the train data of the retrieval task set (`task`) must hold."""
    described = tasks.get(task).described if task in tasks.TASKS else "a retrieval model"
    return (
        f"{described[0].upper()}{described[1:]} (task={task}) trains on an anchor (or query) column and a positive "
        "column (a negative column optional), or on sentence pairs with a numeric score column"
    )


def layout(src: Source) -> tuple[str, str, str | None] | None:
    """(anchor, positive, negative or None) column names where the table has the rows layout, else None."""
    lookup = {c.lower(): c for c in reversed(src.columns)}

    def first(names: tuple[str, ...]) -> str | None:
        return next((lookup[n] for n in names if n in lookup), None)

    anchor, positive = first(ANCHOR_COLUMNS), first(POSITIVE_COLUMNS)
    return (anchor, positive, first(NEGATIVE_COLUMNS)) if anchor and positive else None


def has_rows_layout(sources: list[Source]) -> bool:
    return layout(sources[0]) is not None


def build_embedding(
    sources: dict[str, list[Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    """Each split's dataset, the label names (the score column's name for scored pairs; none for rows)
    and the train labels (what the eval hold-out stratifies on)."""
    rows = {role for role, srcs in sources.items() if has_rows_layout(srcs)}
    if "train" not in rows:
        splits, names, train_labels = _scored_pairs({r: s for r, s in sources.items() if r not in rows}, spec)
        splits.update({role: _rows(sources[role], role, negatives=False) for role in rows})
        return splits, names, train_labels
    negatives = layout(sources["train"][0])[2] is not None  # type: ignore[index]
    # An evaluation's negatives: dropped where train has none (an embedding model ranks every row's positive),
    # kept where the task evaluates them (a reranker's pairs).
    evaluated = spec.task != tasks.AUTO and tasks.get(spec.task).rows.evaluates_negatives
    splits = {
        role: _rows(srcs, role, negatives or (evaluated and role != "train"))
        if role in rows
        else _scored_split(srcs, spec, role)
        for role, srcs in sources.items()
    }
    return splits, [], np.zeros(len(splits["train"]), dtype=np.int64)


def _rows(sources: list[Source], role: str, negatives: bool) -> datasets.Dataset:
    frames = []
    for src in sources:
        found = layout(src)
        if found is None:
            raise DataError(
                f"The train data has anchor and positive columns but the {role} data ({src.where}) has not "
                f"(columns: {', '.join(src.columns)}). Use the same columns in every split."
            )
        anchor, positive, negative = found
        if role == "train" and negatives and negative is None:
            raise DataError(
                f"The train data's first file has a negative column but {src.where} has not. Add one, or drop the "
                "negative column."
            )
        negative = negative if negatives else None  # an evaluation without negatives scores as well
        wanted = [anchor, positive] + ([negative] if negative else [])
        data = src.data.select_columns(wanted).to_pandas() if isinstance(src.data, datasets.Dataset) else src.data
        frame = pd.DataFrame(
            {
                "text": texts_of(data[anchor], role, anchor, src.where),
                "text_pair": texts_of(data[positive], role, positive, src.where),
            }
        )
        if negative:
            frame["text_negative"] = texts_of(data[negative], role, negative, src.where)
        frames.append(frame)
        described = f"anchor column '{anchor}', positive column '{positive}'" + (
            f", negative column '{negative}'" if negative else ""
        )
    frame = pd.concat(frames, ignore_index=True)
    if frame.isna().any().any():  # some files of the split with a negative column, some without
        raise DataError(
            f"The {role} data's files differ: some have a negative column, some not ({describe_sources(sources)}). "
            "Give every file the same columns."
        )
    columns = {name: frame[name].tolist() for name in frame.columns}
    columns["label"] = [float("nan")] * len(frame)
    features = datasets.Features({**{name: datasets.Value("string") for name in frame.columns}, "label": _SCORE})
    logger.info("%s: %d rows from %s; %s", role, len(frame), describe_sources(sources), described)
    return datasets.Dataset.from_dict(columns, features=features)


_SCORE = datasets.Value("float32")


def _scored_split(sources: list[Source], spec: DataSpec, role: str) -> datasets.Dataset:
    """An eval or test split of scored pairs beside (anchor, positive) train rows: scored by Spearman."""
    spec = as_scores(spec)
    parts = [text_part(src, spec, role) for src in sources]
    lone = next((p for p in parts if "text_pair" not in p.frame), None)
    if lone is not None:
        raise DataError(
            f"The {role} data ({lone.where}) has one text a row: an embedding model is evaluated on anchor and "
            "positive columns, or on sentence pairs with a numeric score (sentence1, sentence2, score)."
        )
    codec = RegressionCodec([parts[0].label_name])
    labels = np.concatenate([codec.encode(p, role) for p in parts])
    frame = pd.concat([p.frame for p in parts], ignore_index=True)
    logger.info("%s: %d scored pairs from %s; %s", role, len(frame), describe_sources(sources), parts[0].described)
    features = datasets.Features({"text": _TEXT, "text_pair": _TEXT, "label": _SCORE})
    columns = {"text": frame["text"].tolist(), "text_pair": frame["text_pair"].tolist(), "label": labels}
    return datasets.Dataset.from_dict(columns, features=features)


_TEXT = datasets.Value("string")


def _scored_pairs(
    sources: dict[str, list[Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    """Sentence pairs and their scores: read as a pair regression's data is (its columns, its checks)."""
    try:
        splits, names, train_labels, _ = build_text(sources, as_scores(spec))
    except DataError as err:
        hint = rows_hint(spec.task)  # (the task set: scored pairs train a retrieval model only when asked)
        raise DataError(f"{hint}. {str(err).replace('task=regression', f'task={spec.task}')}") from None
    if "text_pair" not in splits["train"].column_names:
        raise DataError(
            f"{rows_hint(spec.task)}; the train data ({sources['train'][0].where}) has one text a row. Name the "
            "columns anchor and positive, or give sentence1, sentence2 and score (or set text_column and "
            "text_pair_column)."
        )
    return splits, names, train_labels
