"""Pretokenized data (a table with `input_ids`): keeping the token columns, checking the label ids
and building `input_ids`, `attention_mask`, `token_type_ids` (those present) + `labels` (int64).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import NamedTuple

import datasets
import numpy as np
import pandas as pd

from byoc.errors import brief
from byoc.training.data.columns import explicit_column, fail_on_missing
from byoc.training.data.labels import MAX_LABEL_IDS, integral, row_count
from byoc.training.data.names import TOKEN_COLUMNS
from byoc.training.data.types import DataError, DataSpec, Source, describe_sources

logger = logging.getLogger(__name__)


def is_pretokenized(sources: list[Source]) -> bool:
    """Whether a split is already tokenized (has input_ids): then it skips column picking and tokenizing."""
    return any("input_ids" in src.columns for src in sources)


class _TokenPart(NamedTuple):
    """One pretokenized source: token columns + int64 'labels', and its labels as an array."""

    dataset: datasets.Dataset
    labels: np.ndarray
    class_names: list[str] | None
    where: str
    column: str  # the label column's name in the data


def build_pretokenized(
    sources: dict[str, list[Source]], spec: DataSpec, cache_dir: Path
) -> tuple[dict[str, datasets.Dataset], list[str], np.ndarray]:
    """Each split as a dataset of its token columns + `labels`, the label names (ClassLabel names, else
    "0".."K-1") and the train label ids (for the hold-out)."""
    parts = {role: [_pretokenized_part(src, spec, role, cache_dir) for src in srcs] for role, srcs in sources.items()}
    train_names = next((p.class_names for p in parts["train"] if p.class_names is not None), None)
    train_max = max(int(p.labels.max()) for p in parts["train"])
    label_names = list(train_names) if train_names is not None else [str(i) for i in range(train_max + 1)]

    splits, train_labels = {}, np.array([], dtype=np.int64)
    for role, ps in parts.items():
        for part in ps:
            bad = part.labels >= len(label_names)
            if bad.any():
                first = int(np.flatnonzero(bad)[0]) + 1
                raise DataError(
                    f"The {role} data ({part.where}) has label id {int(part.labels[bad][0])} in column "
                    f"'{part.column}' ({row_count(int(bad.sum()))}, first at row {first}) that the train data "
                    f"does not have; known label ids: 0..{len(label_names) - 1}."
                )
        datasets_ = [p.dataset for p in ps]
        if len(datasets_) > 1:
            try:
                datasets_ = [ds.cast(datasets_[0].features) for ds in datasets_]
                splits[role] = datasets.concatenate_datasets(datasets_)
            except Exception as err:
                raise DataError(
                    f"The {role} data files have different columns or types ({brief(err, 200)}); make them match."
                ) from err
        else:
            splits[role] = datasets_[0]
        labels = np.concatenate([p.labels for p in ps])
        if role == "train":
            train_labels = labels
        logger.info(
            "%s: %d pretokenized rows from %s; columns %s; %d labels",
            role,
            len(splits[role]),
            describe_sources(sources[role]),
            ", ".join(splits[role].column_names),
            len(np.unique(labels)),
        )
    return splits, label_names, train_labels


def _pretokenized_part(src: Source, spec: DataSpec, role: str, cache_dir: Path) -> _TokenPart:
    columns = src.columns
    label: str | None
    if spec.label_column:
        label = explicit_column(spec.label_column, "label_column", columns, role, src.where)
    else:
        label = next((c for c in columns if c.lower() == "labels"), None) or next(
            (c for c in columns if c.lower() == "label"), None
        )
    if label is None:
        raise DataError(
            f"The pretokenized {role} data ({src.where}) has no 'labels' or 'label' column; columns: "
            f"{', '.join(columns)}. Add one or set the label_column hyperparameter."
        )
    keep = [c for c in TOKEN_COLUMNS if c in columns] + [label]
    if isinstance(src.data, datasets.Dataset):
        ds = src.data.select_columns(keep)
        if ds.cache_files:
            # Memory-mapped from the (read-only) channel: later map()/cast() would write their
            # cache files next to it, so work on a copy under cache_dir instead.
            cache_dir.mkdir(parents=True, exist_ok=True)
            copy = tempfile.mkdtemp(prefix=f"{role}-", dir=cache_dir)  # fresh: never clobber a copy in use
            ds.save_to_disk(copy)
            ds = datasets.load_from_disk(copy)
    else:
        try:
            ds = datasets.Dataset.from_pandas(src.data[keep], preserve_index=False)
        except Exception as err:
            raise DataError(f"Could not read the pretokenized {role} data ({src.where}): {brief(err, 200)}") from err

    column = ds.data.column(label)
    values = column.to_pandas()
    fail_on_missing(values.isna(), role, label, src.where)
    if not pd.api.types.is_numeric_dtype(values):
        raise DataError(
            f"The pretokenized {role} data ({src.where}) has non-numeric labels in '{label}'; "
            "pretokenized labels must be integer ids 0..num_labels-1."
        )
    class_names = src.class_names.get(label)
    _check_label_ids(values, class_names, role, label, src.where)
    labels = integral(values, role, src.where)
    if label != "labels":
        ds = ds.rename_column(label, "labels")
    if ds.features["labels"] != datasets.Value("int64"):
        ds = ds.cast_column("labels", datasets.Value("int64"))
    return _TokenPart(ds, labels, class_names, src.where, label)


def _check_label_ids(values: pd.Series, class_names: list[str] | None, role: str, column: str, where: str) -> None:
    """Label ids index the label names (a ClassLabel's, else "0".."K-1"): refuse the others before any
    name is built (an id of 10^12 would build 10^12 names, and a ClassLabel id past its names has none)."""
    bound = len(class_names) if class_names is not None else MAX_LABEL_IDS
    bad = (values < 0) | (values >= bound)
    if not bad.any():
        return
    first = int(np.flatnonzero(bad.to_numpy())[0])
    value = values.iloc[first]
    shown = int(value) if float(value).is_integer() else value
    if value < 0:
        problem = f"negative label id {shown}"
        fix = "Fill in those labels (-1 marks a missing label in datasets) or remove the rows."
    elif class_names is not None:
        problem = f"label id {shown}, beyond its {bound} ClassLabel names (ids 0..{bound - 1})"
        fix = "Fix those labels or add their names to the ClassLabel feature."
    else:
        problem = f"label id {shown}, beyond the largest label id byoc accepts ({MAX_LABEL_IDS - 1})"
        fix = (
            "Label ids stand for the labels 0..K-1, K labels in all: renumber them 0..K-1 "
            "(or give the column a ClassLabel feature with the label names)."
        )
    raise DataError(
        f"The pretokenized {role} data ({where}) has {problem} in column '{column}' "
        f"({row_count(int(bad.sum()))}, first at row {first + 1}). {fix}"
    )
