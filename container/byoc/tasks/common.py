"""What a task's parts share: their base (`Part`, which reads the task's identity), the error a request's parameter
raises, the label filler rows carry, and the NumPy functions both sides apply to a model's outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from byoc import model_folder

TRANSFORMERS_PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
IGNORE_LABEL = -100  # what the classification loss ignores; marks filler rows and untagged sub-tokens


class Identity(Protocol):
    """What a part reads of its task (byoc.tasks.base.Task, which imports the parts: named here by its shape)."""

    name: str
    described: str
    auto_class: str
    head: Any
    rows: Any
    recipe: Any
    evaluation: Any

    def scores(self, logits: np.ndarray) -> np.ndarray: ...


class Part:
    """One of a task's interfaces: its serving head (byoc.tasks.head), training rows (byoc.tasks.rows), training
    recipe (byoc.tasks.recipe) or evaluation (byoc.tasks.evaluation). Made by its task (byoc.tasks.base.Task),
    whose identity it reads through `task`: its name, how messages name it, the transformers class its folder
    loads as, its scores from a batch's outputs, and its other parts."""

    def __init__(self, task: Identity) -> None:
        self.task = task


class BadParameter(ValueError):
    """A request's parameter the task cannot honour (serving answers it with a 400 naming it)."""


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


def activated(logits: np.ndarray, activation: str) -> np.ndarray:
    """`logits` through a cross-encoder's activation, by its torch class's name (byoc.tasks.ACTIVATIONS), as
    sentence-transformers' CrossEncoder.predict applies it."""
    if activation == "Sigmoid":
        return sigmoid(logits)
    if activation == "Tanh":
        return np.tanh(np.asarray(logits, dtype=np.float64))
    if activation == "Softmax":
        return softmax(np.asarray(logits, dtype=np.float64))
    if activation == "Identity":
        return np.asarray(logits)
    raise ValueError(f"unknown activation {activation!r}")


def kept_rows(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows that are not filler rows of a fixed-shape batch (labelled IGNORE_LABEL). Scored against the
    label ids returned with the predictions, never the dataset's column: the evaluation order need not be
    the dataset's. A copy only where there are filler rows: multi-label logits can be GBs."""
    keep = labels.reshape(len(labels), -1)[:, 0] != IGNORE_LABEL
    return (logits, labels) if keep.all() else (logits[keep], labels[keep])


def check_pairs(task: Any, model: Mapping) -> None:
    """BadParameter for a rerank request to a model byoc trained on single texts (config.json says so)."""
    if model.get("pairs") is False:
        raise BadParameter(
            f"this model does not rerank: it is {task.described} trained on single texts, not on (query, text) "
            "pairs; train it on pairs (two text columns) to rerank with it"
        )


def trained_on_pairs(config: Mapping[str, Any]) -> bool | None:
    """Whether byoc trained the model on sentence pairs (config.json's byoc_pairs); None where it does not say."""
    value = config.get(model_folder.PAIRS_KEY)
    return value if isinstance(value, bool) else None
