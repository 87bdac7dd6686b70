"""Text data: picking the text (and sentence-pair) and label columns of each table, by explicit
name, by a known name or by the two-column fallback (or the 0/1 label columns of a multi-label
table), and building the normalised `text` [, `text_pair`], `label` datasets: `label` is an int64
class id, a float32 0/1 vector (multi-label) or a float32 target (regression).
"""

from __future__ import annotations

import difflib
import logging

import datasets
import numpy as np
import pandas as pd

from byoc import tasks
from byoc.training.data import task_choice
from byoc.training.data.names import ID_COLUMN, LABEL_COLUMNS, NUMBER, PAIR_COLUMNS, TEXT_COLUMNS
from byoc.training.data.types import DataError, DataSpec, Part, Source, describe_sources

logger = logging.getLogger(__name__)


def build_text(
    sources: dict[str, list[Source]], spec: DataSpec
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray, str]:
    """Each split as a `text` [, `text_pair`], `label` dataset, the label names (from the train data),
    the train labels (for the hold-out) and the task (a byoc.tasks name)."""
    parts = {role: [text_part(src, spec, role) for src in srcs] for role, srcs in sources.items()}
    paired = "text_pair" in parts["train"][0].frame
    for role, ps in parts.items():
        odd = next((p for p in ps if ("text_pair" in p.frame) != paired), None)
        if odd is not None:
            raise DataError(
                f"The train data {'has' if paired else 'has no'} a second text column (sentence pairs) "
                f"but the {role} data ({odd.where}) differs. Use the same columns in every split."
            )

    task = task_choice.decide(spec.task, parts["train"])
    for role, ps in parts.items():
        if role != "train":
            for part in ps:
                task_choice.label_kind(part, role)  # one kind per column (eval may differ from train: encode says)
    codec = task_choice.codec(task, parts["train"], spec.label_delimiter)
    feature = getattr(codec, "feature", datasets.Value("int64"))
    splits, train_labels = {}, np.array([], dtype=np.int64)
    for role, ps in parts.items():
        labels = np.concatenate([codec.encode(p, role) for p in ps])
        frame = pd.concat([p.frame for p in ps], ignore_index=True)
        features = {"text": datasets.Value("string")}
        columns = {"text": frame["text"].tolist()}
        if paired:
            features["text_pair"] = datasets.Value("string")
            columns["text_pair"] = frame["text_pair"].tolist()
        features["label"] = feature
        columns["label"] = [row.tolist() for row in labels] if labels.dtype == object else labels
        splits[role] = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
        if role == "train":
            train_labels = labels
        logger.info(
            "%s: %d rows from %s; %s; %s",
            role,
            len(frame),
            describe_sources(sources[role]),
            ps[0].described,
            tasks.get(task).rows.label_summary(labels),
        )
    return splits, codec.names, train_labels, task


def text_part(src: Source, spec: DataSpec, role: str) -> Part:
    """One table's text (and pair) columns and its raw labels, the columns picked as `spec` says."""
    data = src.data
    text, pair, label = _pick_columns(src, spec, role)
    wanted = [c for c in (text, pair, *(label if isinstance(label, list) else [label])) if c]
    if isinstance(data, datasets.Dataset):  # only the needed columns go to pandas
        data = data.select_columns(wanted).to_pandas()
    frame = pd.DataFrame({"text": texts_of(data[text], role, text, src.where)})
    if pair:
        frame["text_pair"] = texts_of(data[pair], role, pair, src.where)
    described = f"text column '{text}'" + (f", pair column '{pair}'" if pair else "")
    if isinstance(label, list):  # one 0/1 column per label
        labels = task_choice.rows_of_columns(data, label, role, src.where)
        shown = ", ".join(label[:5]) + (", ..." if len(label) > 5 else "")
        described = f"{described}, {len(label)} label columns ({shown})"
        return Part(frame, labels, list(label), src.where, described, "labels")
    labels = data[label].reset_index(drop=True)
    class_names = src.class_names.get(label)
    missing = labels.isna() if not labels.map(task_choice.kind_of).eq("list").any() else labels.map(lambda v: v is None)
    missing |= labels.map(lambda v: isinstance(v, str) and not v.strip())
    if class_names is not None:
        # datasets marks "no label" (e.g. GLUE test sets) with -1
        missing |= labels.map(lambda v: isinstance(v, (int, np.integer)) and v == -1)
    fail_on_missing(missing, role, label, src.where)
    return Part(frame, labels, class_names, src.where, f"{described}, label column '{label}'", label)


def texts_of(values: pd.Series, role: str, column: str, where: str) -> pd.Series:
    """A text column's values as strings; rows without one are refused (`fail_on_missing`)."""
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


def _pick_columns(src: Source, spec: DataSpec, role: str) -> tuple[str, str | None, str | list[str]]:
    """(text, text pair or None, label) column names: explicit names first, then known names,
    then the two-column fallback (one text column and one other). The label is a list of columns
    where each label has a 0/1 column of its own (label_columns, or found: every other column 0/1)."""
    columns = src.columns
    lookup = {c.lower(): c for c in reversed(columns)}  # on a case clash the first column wins

    def explicit(name: str | None, setting: str) -> str | None:
        return explicit_column(name, setting, columns, role, src.where) if name else None

    if spec.label_columns:
        label_columns = [explicit_column(c, "label_columns", columns, role, src.where) for c in spec.label_columns]
    else:
        label_columns = []
    label = None
    if not label_columns:
        label = explicit(spec.label_column, "label_column") or _first_known(LABEL_COLUMNS, lookup)
    pair = explicit(spec.text_pair_column, "text_pair_column")
    text = explicit(spec.text_column, "text_column")
    if not (spec.text_column or spec.text_pair_column):
        found = next(((lookup[a], lookup[b]) for a, b in PAIR_COLUMNS if a in lookup and b in lookup), None)
        text, pair = found or (None, None)
    if text is None:
        text = _first_known(TEXT_COLUMNS, lookup, exclude={label, pair, *label_columns})
    if label is None and not label_columns and task_choice.looks_for_label_columns(spec.task):
        label_columns = _binary_label_columns(src, text, pair)
    if label_columns:
        if text is None:
            textual = [c for c in columns if c not in label_columns and _looks_textual(_column(src.data, c))]
            text = textual[0] if len(textual) == 1 else None
        if text is None:
            named = _first_known(TEXT_COLUMNS, lookup, exclude={pair})
            if named in label_columns:  # label_columns=anger,joy,text
                raise DataError(
                    f"label_columns names '{named}', the {role} data's text column ({src.where}): label columns "
                    f"hold 0 or 1 per label. Leave '{named}' out of label_columns (or set text_column)."
                )
            raise DataError(
                f"Could not find the text column in the {role} data ({src.where}); columns: {', '.join(columns)}. "
                "Set the text_column hyperparameter."
            )
        if text in label_columns or pair in label_columns:
            raise DataError(f"Column '{text}' cannot be both text and a label column; fix label_columns.")
        return text, pair, label_columns

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


def _binary_label_columns(src: Source, text: str | None, pair: str | None) -> list[str]:
    """The multi-label layout of one 0/1 column per label (Kaggle's toxic comments, SemEval E-c): at
    least two columns besides the text and identifier columns, every one of them 0/1."""
    rest = [c for c in src.columns if c not in (text, pair) and not ID_COLUMN.fullmatch(c)]
    if text is None:
        textual = [c for c in rest if _looks_textual(_column(src.data, c))]
        if len(textual) != 1:
            return []
        rest = [c for c in rest if c != textual[0]]
    if len(rest) < 2:
        return []
    return rest if task_choice.binary_columns(src.data, rest) else []


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
