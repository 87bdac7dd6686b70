"""Labels: the train label set and the codec that turns every split's raw labels (names, whole
numbers, ClassLabel ids) into ids, and the seeded, stratified eval hold-out (validation_split).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from byoc.training.data.names import NUMBER
from byoc.training.data.types import DataError, Part

# Pretokenized label ids 0..K-1 without ClassLabel names stand for K labels, named "0".."K-1": past a
# million labels (a classification head of a million rows) an id is a mistake, not a class.
MAX_LABEL_IDS = 1_000_000


@dataclass
class LabelCodec:
    """The train label set and how to turn any split's raw labels into ids."""

    names: list[str]
    to_id: dict  # canonical label value -> id
    numeric: bool  # labels are integers (ids or values like 1..5)
    from_classlabel: bool

    @classmethod
    def from_train(cls, parts: list[Part]) -> LabelCodec:
        with_names = [p.class_names for p in parts if p.class_names is not None]
        if with_names:  # a ClassLabel feature keeps its names and ids
            names = list(with_names[0])
            return cls(names, {n: i for i, n in enumerate(names)}, False, True)
        raw = pd.concat([p.labels for p in parts], ignore_index=True)
        numbers = as_numbers(raw)
        if numbers is not None:
            # 0..K-1 keep their ids; other integers (1..5, -1/1) map to ids in sorted order.
            values = sorted(set(integral(numbers, "train", parts[0].where).tolist()))
            return cls([str(v) for v in values], {v: i for i, v in enumerate(values)}, True, False)
        values = sorted(set(raw.astype(str).str.strip()))
        return cls(values, {v: i for i, v in enumerate(values)}, False, False)

    def encode(self, part: Part, role: str) -> np.ndarray:
        labels = part.labels
        if part.class_names is not None:  # ids of this split's ClassLabel -> its names
            names = part.class_names
            bad = ~labels.isin(range(len(names)))
            if bad.any():
                self._unknown(labels[bad].iloc[0], bad, role, part.where)
            labels = labels.map(lambda i: names[int(i)])
        elif self.from_classlabel and pd.api.types.is_integer_dtype(labels):
            labels = labels.map(lambda i: self.names[i] if 0 <= i < len(self.names) else i)

        if self.numeric:
            numbers = as_numbers(labels)
            if numbers is None:  # some label is not a number: report the first one
                bad = ~labels.map(lambda v: isinstance(v, (int, float)) or bool(NUMBER.fullmatch(str(v).strip())))
                self._unknown(labels[bad].iloc[0], bad, role, part.where)
            keys = pd.Series(integral(numbers, role, part.where))
        else:
            keys = labels.astype(str).str.strip()
        ids = keys.map(self.to_id)
        unknown = ids.isna()
        if unknown.any():
            self._unknown(keys[unknown].iloc[0], unknown, role, part.where)
        return ids.to_numpy(dtype=np.int64)

    def _unknown(self, value: object, bad: pd.Series, role: str, where: str) -> None:
        known = ", ".join(self.names[:10]) + (", ..." if len(self.names) > 10 else "")
        first = int(np.flatnonzero(bad.to_numpy())[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has label '{value}' ({row_count(int(bad.sum()))}, first at row {first}) "
            f"that the train data does not have; known labels: {known}. "
            "Fix those labels or add examples of them to the train data."
        )


def as_numbers(values: pd.Series) -> pd.Series | None:
    """The labels as numbers when every label is a number or a numeric string, else None."""
    if values.map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any():
        return None
    if pd.api.types.is_bool_dtype(values):
        return values.astype("int64")
    if pd.api.types.is_numeric_dtype(values):
        return values
    stripped = values.map(lambda v: v.strip() if isinstance(v, str) else v)
    is_number = stripped.map(
        lambda v: (
            (isinstance(v, (int, float, np.number)) and not isinstance(v, bool))
            or (isinstance(v, str) and bool(NUMBER.fullmatch(v)))
        )
    )
    if not is_number.all():
        return None
    try:
        numbers = pd.to_numeric(stripped)
    except OverflowError:
        numbers = None
    # An integer past float64's range (hundreds of digits): pandas raises, or keeps it a Python int (an object
    # column, which every float conversion after would fail on); infinite here, refused by row later.
    if numbers is None or numbers.dtype == object:
        return stripped.map(to_float).astype(np.float64)
    return numbers


def to_float(value: object) -> float:
    """A number as a float; one too large for float64 is infinite (the callers refuse it, naming its row)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        return math.inf if not str(value).lstrip().startswith("-") else -math.inf


def integral(numbers: pd.Series, role: str, where: str) -> np.ndarray:
    """The labels as int64 ids or values; a fractional label means regression, which a classifier cannot learn."""
    array = (
        np.array([to_float(v) for v in numbers], dtype=np.float64)
        if numbers.dtype == object
        else numbers.to_numpy(dtype=np.float64)
    )
    fractional = (array != np.round(array)) | ~np.isfinite(array) | (np.abs(array) >= 2.0**63)
    if fractional.any():
        first = int(np.flatnonzero(fractional)[0]) + 1
        raise DataError(
            f"The {role} data ({where}) has non-integer label {array[first - 1]:g} (first at row {first}), but "
            "a classifier needs class labels (names or whole numbers). For a number per text set task=regression; "
            "otherwise fix those labels."
        )
    return array.astype(np.int64)


def holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, eval) row indices holding out `fraction` of the rows, seeded, and
    stratified when every stratum has at least two rows: by class ids (int), by the decile of a
    regression target (float), by the label set of multi-label rows (2-D: rare sets fall back to random)."""
    n = len(labels)
    labels = _strata(np.asarray(labels))
    n_eval = round(n * fraction)
    if n_eval < 1 or n_eval >= n:
        raise DataError(
            f"validation_split={fraction} of {n} train rows leaves no eval or no train rows; "
            "use a different validation_split or provide a validation channel."
        )
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() >= 2 and n_eval >= len(classes):
        # Each label keeps its share (at least one row on each side).
        picks = []
        for cls in classes:
            rows = np.flatnonzero(labels == cls)
            k = min(max(1, round(len(rows) * fraction)), len(rows) - 1)
            picks.append(rng.permutation(rows)[:k])
        eval_idx = np.sort(np.concatenate(picks))
    else:
        eval_idx = np.sort(rng.permutation(n)[:n_eval])
    train_idx = np.setdiff1d(np.arange(n), eval_idx)
    return train_idx, eval_idx


def _strata(labels: np.ndarray) -> np.ndarray:
    """What the hold-out stratifies by: class ids as they are, a regression target's decile, and a
    multi-label row's set of labels (its label ids, or its 0/1 vector, as one id)."""
    if labels.dtype == object:
        return pd.factorize(pd.Series([tuple(row) for row in labels], dtype=object))[0]
    if labels.ndim == 2:
        return np.unique(labels, axis=0, return_inverse=True)[1].reshape(-1)
    if np.issubdtype(labels.dtype, np.floating):
        edges = np.quantile(labels, np.linspace(0, 1, 11)[1:-1]) if len(labels) else []
        return np.digitize(labels, np.unique(edges))
    return labels


def row_count(n: int) -> str:
    """ "1 row" / "3 rows", for messages."""
    return f"{n} row" if n == 1 else f"{n} rows"
