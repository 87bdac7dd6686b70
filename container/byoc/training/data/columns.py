"""Text data: picking the text (and sentence-pair) and label columns of each table, by explicit
name, by a known name or by the two-column fallback, and building the normalised `text`
[, `text_pair`], `label` (int64) datasets.
"""

from __future__ import annotations

import difflib
import logging

import datasets
import numpy as np
import pandas as pd

from byoc.training.data.labels import LabelCodec
from byoc.training.data.names import LABEL_COLUMNS, NUMBER, PAIR_COLUMNS, TEXT_COLUMNS
from byoc.training.data.types import DataError, DataSpec, Part, Source, describe_sources

logger = logging.getLogger(__name__)


def build_text(
    sources: dict[str, list[Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    """Each split as a `text` [, `text_pair`], `label` dataset, the label names (from the train data)
    and the train label ids (for the hold-out)."""
    parts = {role: [_text_part(src, spec, role) for src in srcs] for role, srcs in sources.items()}
    paired = "text_pair" in parts["train"][0].frame
    for role, ps in parts.items():
        odd = next((p for p in ps if ("text_pair" in p.frame) != paired), None)
        if odd is not None:
            raise DataError(
                f"The train data {'has' if paired else 'has no'} a second text column (sentence pairs) "
                f"but the {role} data ({odd.where}) differs. Use the same columns in every split."
            )

    codec = LabelCodec.from_train(parts["train"])
    splits, train_labels = {}, np.array([], dtype=np.int64)
    for role, ps in parts.items():
        labels = np.concatenate([codec.encode(p, role) for p in ps])
        frame = pd.concat([p.frame for p in ps], ignore_index=True)
        features = {"text": datasets.Value("string")}
        columns = {"text": frame["text"].tolist()}
        if paired:
            features["text_pair"] = datasets.Value("string")
            columns["text_pair"] = frame["text_pair"].tolist()
        features["label"] = datasets.Value("int64")
        columns["label"] = labels
        splits[role] = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
        if role == "train":
            train_labels = labels
        logger.info(
            "%s: %d rows from %s; %s; %d labels",
            role,
            len(frame),
            describe_sources(sources[role]),
            ps[0].described,
            len(np.unique(labels)),
        )
    return splits, codec.names, train_labels


def _text_part(src: Source, spec: DataSpec, role: str) -> Part:
    data = src.data
    text, pair, label = _pick_columns(src, spec, role)
    if isinstance(data, datasets.Dataset):  # only the needed columns go to pandas
        data = data.select_columns([c for c in (text, pair, label) if c]).to_pandas()
    frame = pd.DataFrame({"text": _texts(data[text], role, text, src.where)})
    if pair:
        frame["text_pair"] = _texts(data[pair], role, pair, src.where)
    labels = data[label].reset_index(drop=True)
    class_names = src.class_names.get(label)
    missing = labels.isna() | labels.map(lambda v: isinstance(v, str) and not v.strip())
    if class_names is not None:
        missing |= labels.eq(-1)  # datasets marks "no label" (e.g. GLUE test sets) with -1
    fail_on_missing(missing, role, label, src.where)
    described = f"text column '{text}'" + (f", pair column '{pair}'" if pair else "") + f", label column '{label}'"
    return Part(frame, labels, class_names, src.where, described)


def _texts(values: pd.Series, role: str, column: str, where: str) -> pd.Series:
    values = values.reset_index(drop=True)
    missing = values.isna() | values.map(lambda v: isinstance(v, str) and not v.strip())
    fail_on_missing(missing, role, column, where)
    return values.astype(str)


def fail_on_missing(missing: pd.Series, role: str, column: str, where: str) -> None:
    """Reject rows without a text or label, naming how many and the first."""
    if missing.any():
        first = int(np.flatnonzero(missing.to_numpy())[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has no value in column '{column}' in {int(missing.sum())} of "
            f"{len(missing)} rows (first at row {first}). Fill in or remove those rows."
        )


def _pick_columns(src: Source, spec: DataSpec, role: str) -> tuple[str, str | None, str]:
    """(text, text pair or None, label) column names: explicit names first, then known names,
    then the two-column fallback (one text column and one other)."""
    columns = src.columns
    lookup = {c.lower(): c for c in reversed(columns)}  # on a case clash the first column wins

    def explicit(name: str | None, setting: str) -> str | None:
        return explicit_column(name, setting, columns, role, src.where) if name else None

    label = explicit(spec.label_column, "label_column") or _first_known(LABEL_COLUMNS, lookup)
    pair = explicit(spec.text_pair_column, "text_pair_column")
    text = explicit(spec.text_column, "text_column")
    if not (spec.text_column or spec.text_pair_column):
        found = next(((lookup[a], lookup[b]) for a, b in PAIR_COLUMNS if a in lookup and b in lookup), None)
        text, pair = found or (None, None)
    if text is None:
        text = _first_known(TEXT_COLUMNS, lookup, exclude={label, pair})

    if (text is None or label is None) and len(columns) == 2:
        if text is not None or label is not None:
            other = [c for c in columns if c not in (text, label)]
            text, label = (text or other[0], label or other[0])
        else:
            textual = [c for c in columns if _looks_textual(_column(src.data, c))]
            if len(textual) == 1:
                text = textual[0]
                label = next(c for c in columns if c != text)
    shown = ", ".join(columns)
    if text is None:
        raise DataError(
            f"Could not find the text column in the {role} data ({src.where}); columns: {shown}. "
            "Set the text_column hyperparameter (and text_pair_column for sentence pairs)."
        )
    if label is None:
        raise DataError(
            f"Could not find the label column in the {role} data ({src.where}); columns: {shown}. "
            "Set the label_column hyperparameter."
        )
    if label in (text, pair):
        raise DataError(
            f"Column '{label}' cannot be both text and label; set text_column and label_column to different columns."
        )
    return text, pair, label


def explicit_column(name: str, setting: str, columns: list[str], role: str, where: str) -> str:
    """The column a hyperparameter names (case-insensitively if unambiguous), or a DataError with a hint."""
    if name in columns:
        return name
    folded = [c for c in columns if c.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    close = difflib.get_close_matches(name, columns, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise DataError(
        f"{setting} '{name}' is not a column of the {role} data ({where}); columns: {', '.join(columns)}.{hint}"
    )


def _first_known(names: tuple[str, ...], lookup: dict[str, str], exclude: set | None = None) -> str | None:
    return next((lookup[n] for n in names if n in lookup and lookup[n] not in (exclude or set())), None)


def _column(data: pd.DataFrame | datasets.Dataset, name: str) -> pd.Series:
    if isinstance(data, datasets.Dataset):
        return data.select_columns([name]).select(range(min(len(data), 100))).to_pandas()[name]
    return data[name]


def _looks_textual(values: pd.Series) -> bool:
    """Strings that are not all numbers ("0"/"1" labels read from text files are not text)."""
    sample = values.dropna().head(100)
    return (
        len(sample) > 0
        and all(isinstance(v, str) for v in sample)
        and not all(NUMBER.fullmatch(v.strip()) for v in sample)
    )
