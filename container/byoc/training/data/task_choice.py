"""Which task the data asks for (the one place training decides it: byoc.tasks), and the codecs of the
tasks beyond one class per text: several labels per text (each row's label ids) and a number per text
(regression, float32).

`check_request` holds the `task` hyperparameter against the data's form (token data, pretokenized
rows); `decide` reads the train labels of text data: lists of names or ids, or 0/1 label columns, mean
multi-label; numbers that are not all whole mean regression; whole numbers and names mean one class
per text. A `task` the labels contradict is refused, naming the row that does. `codec` encodes each
split's labels for the task decided.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import datasets
import numpy as np
import pandas as pd

from byoc.tasks import (
    AUTO,
    EMBEDDING,
    GENERATIVE_RERANKER,
    LISTWISE_RERANKER,
    MULTI_LABEL,
    MULTI_VECTOR,
    REGRESSION,
    RERANKER,
    SINGLE_LABEL,
    SPARSE_EMBEDDING,
    TOKEN_CLASSIFICATION,
)
from byoc.training.data.labels import LabelCodec, as_numbers, row_count, to_float
from byoc.training.data.types import DataError, DataSpec, Part

# The tasks read from an embedding model's rows (a reranker's become pairs: byoc.training.negatives.as_pairs).
VECTORS = (EMBEDDING, SPARSE_EMBEDDING, RERANKER, LISTWISE_RERANKER, GENERATIVE_RERANKER, MULTI_VECTOR)
_KINDS = {"list": "lists of labels", "number": "numbers", "text": "names (text)"}


def kind_of(value: object) -> str:
    """One label's kind: a list (multi-label), a number, or text."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return "list"
    if isinstance(value, (int, float, np.number, bool, np.bool_)):
        return "number"
    return "text"


def label_kind(part: Part, role: str) -> str:
    """The kind every label of a split's part has; mixed kinds are refused, naming the first odd row."""
    kinds = part.labels.map(kind_of)
    first = kinds.iloc[0]
    odd = kinds != first
    if odd.any():
        row = int(np.flatnonzero(odd.to_numpy())[0])
        raise DataError(
            f"The {role} data ({part.where}) mixes label kinds: row 1 has {_KINDS[first]} but row {row + 1} has "
            f"{_KINDS[kinds.iloc[row]]} ({part.labels.iloc[row]!r}). Use one kind of label in the column."
        )
    return first


def reads_rows(task: str | None) -> bool:
    """Whether the task's training data are an embedding model's: (anchor, positive[, negative]) rows, or
    scored pairs (byoc.training.data.embedding_rows)."""
    return task in VECTORS


def as_scores(spec: DataSpec) -> DataSpec:
    """`spec` reading its labels as a score per row (an embedding model's scored pairs: regression's codec)."""
    return dataclasses.replace(spec, task=REGRESSION)


def check_request(
    requested: str, where: str, tokens: bool, pretokenized: bool, label_columns: bool, rows: bool = False
) -> str | None:
    """The task the data's form decides (token classification for token data, one class per row for
    pretokenized rows, an embedding model for anchor/positive `rows` or when asked), or None where the
    labels decide (`decide`); a `requested` task (canonical, or auto) that the form contradicts is refused."""
    if rows and requested not in (AUTO, *VECTORS):
        raise DataError(
            f"The train data ({where}) has anchor and positive columns, an embedding model's training rows, but "
            f"task={requested}: drop task (or set task=embedding), or name the columns text and label to classify."
        )
    if requested in VECTORS and (tokens or pretokenized):
        raise DataError(
            f"task={requested} trains on texts, but the train data ({where}) is "
            f"{'token data (a tag per token)' if tokens else 'pretokenized (input_ids)'}: give anchor and "
            "positive columns (a negative column optional), or sentence pairs with a score."
        )
    if requested in VECTORS:
        return requested
    if rows:
        return EMBEDDING
    if tokens and requested not in (AUTO, TOKEN_CLASSIFICATION):
        raise DataError(
            f"The train data ({where}) is token data (a tag per token: NER) but task={requested}: "
            "drop task, or set task=token_classification."
        )
    if pretokenized and (requested not in (AUTO, SINGLE_LABEL) or label_columns):
        raise DataError(
            f"Pretokenized data (with input_ids) trains single-label classifiers only, not task={requested}: "
            "give the texts instead (byoc tokenizes them), or one class id per row."
        )
    return TOKEN_CLASSIFICATION if tokens else SINGLE_LABEL if pretokenized else None


def looks_for_label_columns(requested: str) -> bool:
    """Whether a table without a label column may hold one 0/1 column per label (multi-label)."""
    return requested in (AUTO, MULTI_LABEL)


def codec(task: str, train: list[Part], delimiter: str) -> LabelCodec | MultiLabelCodec | RegressionCodec:
    """How each split's labels are encoded for `task`, learnt from the train parts."""
    if task == MULTI_LABEL:
        return MultiLabelCodec.from_train(train, delimiter)
    if task == REGRESSION:
        return RegressionCodec([train[0].label_name])
    return LabelCodec.from_train(train)


def decide(requested: str, parts: list[Part]) -> str:
    """The task of the train data: `requested` (a canonical task or auto) checked against its labels."""
    kinds = {label_kind(p, "train") for p in parts}
    if len(kinds) > 1:
        raise DataError(
            f"The train data files hold different label kinds ({', '.join(_KINDS[k] for k in sorted(kinds))}). "
            "Use one kind of label in every file."
        )
    kind = kinds.pop()
    numbers = None
    if kind != "list":
        numbers = [as_numbers(p.labels) for p in parts]
        if any(n is None for n in numbers):
            numbers = None
    fractional = numbers is not None and any(
        (n.to_numpy(dtype=np.float64) != np.round(n.to_numpy(dtype=np.float64))).any() for n in numbers if n is not None
    )
    if requested == TOKEN_CLASSIFICATION:
        raise DataError(
            f"task=token_classification needs token data, but the train data ({parts[0].where}) has a text and a "
            "label per row: give CoNLL files (.conll: a token and its tag per line) or records with a tokens list "
            "and a ner_tags list, or drop task to classify the texts."
        )
    if requested == AUTO:
        if kind == "list":
            return MULTI_LABEL
        return REGRESSION if fractional else SINGLE_LABEL
    if requested == REGRESSION and numbers is None:
        where, value, row = _first_non_number(parts)
        raise DataError(
            f"task=regression needs numeric labels, but the train data ({where}) has label {value!r} at row {row}. "
            "Use numbers as labels, or drop task=regression to classify by name."
        )
    if requested == SINGLE_LABEL and kind == "list":
        raise DataError(
            f"task=single_label_classification needs one label per row, but the train data ({parts[0].where}) "
            "holds lists of labels. Use task=multi_label_classification (or task=auto)."
        )
    return requested


def _first_non_number(parts: list[Part]) -> tuple[str, object, int]:
    for part in parts:
        for row, value in enumerate(part.labels):
            if as_numbers(pd.Series([value])) is None:
                return part.where, value, row + 1
    return parts[0].where, None, 0  # not reached: decide calls it when some label is not a number


@dataclass
class MultiLabelCodec:
    """The train label set of a multi-label task, and how to turn each split's labels into each row's label
    ids. Held so (not as 0/1 vectors) until a batch is built (byoc.tasks.multi_label.MultiHot): memory grows
    with the labels rows have, not rows x labels (50,000 rows of 20,000 labels are 4 GB as float32 vectors)."""

    names: list[str]
    delimiter: str

    feature = datasets.Sequence(datasets.Value("int32"))

    @classmethod
    def from_train(cls, parts: list[Part], delimiter: str) -> MultiLabelCodec:
        with_names = [p.class_names for p in parts if p.class_names is not None]
        if with_names:  # label columns, or a Sequence(ClassLabel) feature: their order, even unused ones
            codec = cls(list(with_names[0]), delimiter)
            if not any(_items(value, delimiter, p.class_names) for p in parts for value in p.labels):
                raise DataError(
                    f"The train data ({parts[0].where}) has no labels at all: every row's labels "
                    f"({', '.join(codec.names[:10])}) are 0 or empty. A multi-label classifier needs rows with labels."
                )
            return codec
        values = {v for p in parts for row in p.labels for v in _items(row, delimiter, None)}
        numeric = all(isinstance(v, (int, np.integer)) for v in values)
        ordered = sorted(values) if numeric else sorted(str(v) for v in values)
        if not ordered:
            raise DataError(
                f"The train data ({parts[0].where}) has no labels at all: every row's label list is empty. "
                "A multi-label classifier needs rows with labels."
            )
        return cls([str(v) for v in ordered], delimiter)

    def encode(self, part: Part, role: str) -> np.ndarray:
        """Each row's label ids, sorted and unique (an object array of int32 arrays)."""
        index = {name: i for i, name in enumerate(self.names)}
        out = np.empty(len(part.labels), dtype=object)
        for row, value in enumerate(part.labels):
            ids = set()
            for item in _items(value, self.delimiter, part.class_names):
                column = index.get(str(item))
                if column is None:
                    known = ", ".join(self.names[:10]) + (", ..." if len(self.names) > 10 else "")
                    raise DataError(
                        f"The {role} data ({part.where}) has label '{item}' at row {row + 1} that the train data "
                        f"does not have; known labels: {known}. Fix that label or add examples of it to the train data."
                    )
                ids.add(column)
            out[row] = np.array(sorted(ids), dtype=np.int32)
        return out


def _items(value: object, delimiter: str, class_names: list[str] | None) -> list:
    """One row's labels: a list as given (ClassLabel ids as their names), or a string split on `delimiter`."""
    if isinstance(value, (list, tuple, np.ndarray)):
        items = [v.item() if isinstance(v, np.generic) else v for v in value]
    elif isinstance(value, str):
        items = [v.strip() for v in value.split(delimiter)] if delimiter else [value.strip()]
    else:
        items = [value.item() if isinstance(value, np.generic) else value]
    items = [v.strip() if isinstance(v, str) else v for v in items if not (isinstance(v, str) and not v.strip())]
    if class_names is not None:
        named = len(class_names)
        return [class_names[int(v)] if isinstance(v, (int, np.integer)) and 0 <= v < named else v for v in items]
    return items


@dataclass
class RegressionCodec:
    """A regression target: one float per row, finite."""

    names: list[str]  # one name: the label column's, the model's single output

    feature = datasets.Value("float32")

    def encode(self, part: Part, role: str) -> np.ndarray:
        numbers = as_numbers(part.labels)
        if numbers is None:
            where, value, row = _first_non_number([part])
            raise DataError(
                f"The {role} data ({where}) has label {value!r} at row {row}, not a number, but the train "
                "labels are numbers (regression). Fix that label."
            )
        values = _floats(numbers)
        # The model trains in float32: a label past its range (about 3.4e38) would become infinity there
        # and surface as a diverged training, blamed on the learning rate.
        bad = ~np.isfinite(values) | (np.abs(values) > FLOAT32_MAX)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"The {role} data ({part.where}) has regression label {_shown(numbers.iloc[first])} "
                f"({row_count(int(bad.sum()))}, first at row {first + 1}); regression labels must be finite "
                f"numbers within float32's range (±{FLOAT32_MAX:.1e}): fix or rescale them."
            )
        return values.astype(np.float32)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _floats(numbers: pd.Series) -> np.ndarray:
    """The labels as float64; an integer too large even for float64 (400 digits) becomes infinity."""
    try:
        return numbers.to_numpy(dtype=np.float64)
    except OverflowError:
        return np.array([to_float(v) for v in numbers], dtype=np.float64)


def _shown(value: object) -> str:
    """A label in a message: a huge integer by its size, not its 400 digits."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else f"{text[:12]}... (a number of {len(text)} digits)"


def binary_columns(frame: pd.DataFrame | datasets.Dataset, columns: list[str]) -> bool:
    """Whether each column holds only 0/1 values (numbers, booleans or "0"/"1"): label columns."""
    for column in columns:
        values = frame[column] if isinstance(frame, pd.DataFrame) else pd.Series(frame[column][:1000])
        numbers = as_numbers(values.dropna()) if len(values.dropna()) == len(values) else None
        if numbers is None or not numbers.isin([0, 1]).all():
            return False
    return True


def rows_of_columns(frame: pd.DataFrame, columns: list[str], role: str, where: str) -> pd.Series:
    """0/1 label columns as each row's list of the columns set to 1 (the multi-label form)."""
    matrix = []
    for column in columns:
        numbers = as_numbers(frame[column].reset_index(drop=True))
        if numbers is None or frame[column].isna().any() or not numbers.isin([0, 1]).all():
            values = frame[column].reset_index(drop=True)
            bad = values.isna() | ~values.map(lambda v: str(v).strip() in ("0", "1", "0.0", "1.0", "True", "False"))
            row = int(np.flatnonzero(bad.to_numpy())[0]) if bad.any() else 0
            raise DataError(
                f"The {role} data ({where}) has value {values.iloc[row]!r} in label column '{column}' at row "
                f"{row + 1}; label columns hold 0 or 1. Fix that value."
            )
        matrix.append(numbers.to_numpy(dtype=np.int64))
    ones = np.stack(matrix, axis=1) if matrix else np.zeros((len(frame), 0), dtype=np.int64)
    return pd.Series([[columns[j] for j in np.flatnonzero(row)] for row in ones], dtype=object)
