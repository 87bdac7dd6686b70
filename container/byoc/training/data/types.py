"""The types every module of `byoc.training.data` shares: the public `DataError`, `DataSpec` and
`TaskData` (re-exported by `byoc.training.data`), and the tables on their way from a channel to a dataset.

A leaf module (it imports nothing from `byoc.training.data`), so that the modules above it never import
each other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets
import pandas as pd

from byoc.errors import UserError


class DataError(UserError, ValueError):
    """A problem with the user's data. The message says what is wrong and how to fix it,
    in one or two sentences (it becomes the SageMaker FailureReason)."""


@dataclass
class DataSpec:
    text_column: str | None = None  # explicit names override detection
    text_pair_column: str | None = None
    label_column: str | None = None
    label_columns: list[str] | None = None  # one 0/1 column per label (multi-label)
    task: str = "auto"  # auto, or a task of byoc.tasks.NAMES
    label_delimiter: str = ","  # splits a text label into several (multi-label)
    validation_split: float = 0.0  # fraction of train held out as eval when there is no eval data (0 = none)
    seed: int = 42
    max_train_samples: int | None = None  # keep the first N train rows, for quick runs
    max_eval_samples: int | None = None  # applies to eval and test

    def __post_init__(self) -> None:
        if not self.label_delimiter:  # "" would make "joy,love" one label, silently
            raise DataError(
                "hyperparameter label_delimiter is empty: set what separates a row's labels in text (default "
                "','), or a character the labels never hold to keep each text one label"
            )


@dataclass
class TaskData:
    train: datasets.Dataset
    eval: datasets.Dataset | None  # validation data (None if none)
    test: datasets.Dataset | None
    label_names: list[str]  # id -> name; len = num_labels (regression: one, the label column's name)
    pretokenized: bool
    task: str = "single_label_classification"  # a name of byoc.tasks.NAMES: decided when the data is read

    @property
    def paired(self) -> bool:
        """Whether the rows are sentence pairs (config.json records it: a model of single texts does not rerank)."""
        return "text_pair" in self.train.column_names


@dataclass
class Source:
    """One table read from a channel, before columns are picked."""

    data: pd.DataFrame | datasets.Dataset
    where: str  # for messages: "train.csv in /opt/ml/input/data/train"
    fmt: str  # csv, json, ..., or "dataset" for save_to_disk data
    origin: str  # the channel directory or saved-dataset folder it came from
    class_names: dict[str, list[str]] = field(default_factory=dict)  # ClassLabel columns

    @property
    def columns(self) -> list[str]:
        names = self.data.column_names if isinstance(self.data, datasets.Dataset) else self.data.columns
        return [str(c) for c in names]


@dataclass
class Part:
    """One source normalised to text columns, still holding its raw labels."""

    frame: pd.DataFrame  # text [, text_pair]
    labels: pd.Series
    class_names: list[str] | None  # a ClassLabel's names, or the label columns (multi-label)
    where: str
    described: str  # for the log: "text column 'text', label column 'label_name'"
    label_name: str = "label"  # the label column's name (a regression model's output is named after it)


def describe_sources(sources: list[Source]) -> str:
    """ "1 file (csv) in /opt/ml/input/data/train" or "saved dataset split 'train' of /path": where a
    split came from, for the log line of both the text and the pretokenized builders."""
    if sources[0].fmt == "dataset":
        return sources[0].where
    fmts = ", ".join(sorted({src.fmt for src in sources}))
    origins = ", ".join(sorted({src.origin for src in sources}))
    return f"{len(sources)} {'file' if len(sources) == 1 else 'files'} ({fmts}) in {origins}"


def class_names_of(features: datasets.Features) -> dict[str, list[str]]:
    """The label names of each ClassLabel column, and of each list of ClassLabels (multi-label)."""
    names = {}
    for name, feature in features.items():
        inner = getattr(feature, "feature", feature)  # Sequence(ClassLabel) / List(ClassLabel): its items
        if isinstance(inner, datasets.ClassLabel):
            names[name] = list(inner.names)
    return names
