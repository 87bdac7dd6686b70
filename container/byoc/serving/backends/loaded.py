"""The model the default `model_fn` loads: one typed value, built in one place (`LoadedModel.of`) by both
backends (byoc.serving.backends.runtimes).

It is what every default handler and a user's own code receive as `model`. Users' code has always read it
as a dict (`model["encode"]`, `model.get("threshold")`) and may set a value on it (a model_fn of its own
that raises the threshold), so it is a mutable mapping too: its fields by name, then the task's facts
(`Head.serving_facts`: a multi-label model's thresholds, an embedding model's prompts...).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

# What a model loaded in the background replaces when it takes over (`LoadedModel.settle`): how it runs and
# where; what its outputs mean (task, labels, facts) is the folder's, the same on every backend.
RUNTIME_FIELDS: tuple[str, ...] = ("backend", "model", "tokenizer", "encode", "logits", "windows", "max_length")
RUNTIME_FIELDS += ("pad_id", "passes", "device", "precision")


@dataclass(eq=False)
class LoadedModel(MutableMapping[str, Any]):
    """The loaded model: how to run it (`encode`, `logits`, `windows`), what its outputs mean (`task`,
    `id2label`, `facts`) and where it runs (`backend`, `device`, `precision`, `passes`)."""

    backend: str  # onnxruntime or torch
    model: Any  # the ONNX Runtime session, or the torch module
    tokenizer: Any
    # (inputs[, "left" or "right": where a text past max_length is cut]) -> unpadded encodings, in input order
    encode: Callable[..., list[dict[str, list[int]]]]
    logits: Callable[[dict[str, np.ndarray]], np.ndarray]  # one padded batch -> fp32 outputs
    windows: Callable[[list[str]], list[list[dict]]] | None  # a token classifier's windows of each text
    id2label: dict[int, str]
    task: str  # the task's canonical name (byoc.tasks)
    activation: str | None  # a cross-encoder's, as CrossEncoder.predict applies it; None for other models
    max_length: int
    pad_id: int
    passes: Any  # how predict_fn cuts and pads a batch (byoc.serving.backends.passes)
    device: str
    precision: str
    facts: dict[str, Any] = field(default_factory=dict)  # the task's (Head.serving_facts)
    # The numbers one answer may hold (the server's BYOC_MAX_ANSWER_VALUES; None: unbounded): a head whose answer
    # grows with the tokens (token vectors) checks it before building the answer (byoc.tasks.base.check_answer).
    max_answer_values: int | None = None
    # The model loading in the background to take this one's place (torch on CUDA, while ONNX Runtime on the
    # CPU answers: byoc.serving.backends.backend_choice.bridge); None once it has, or where none is.
    upgrade: Future | None = field(default=None, repr=False)

    def settle(self) -> bool:
        """Called on the inference thread between batches: where the model loading in the background has
        loaded, it takes this one's place (its runtime fields) and True is returned. Where it failed, this
        one keeps serving, and the log says why."""
        upgrade = self.upgrade
        if upgrade is None or not upgrade.done():
            return False
        self.upgrade = None
        try:
            loaded = upgrade.result()
        except Exception as err:
            logger.error(
                "the model could not load on its own backend, so %s on the %s keeps serving: %s: %s",
                self.backend,
                self.device,
                type(err).__name__,
                err,
            )
            return False
        was = f"{self.backend} on the {self.device}"
        for name in RUNTIME_FIELDS:
            setattr(self, name, getattr(loaded, name))
        logger.info("now serving on %s (%s), instead of %s", self.backend, self.device, was)
        return True

    @classmethod
    def of(cls, task: Any, facts: dict[str, Any], **fields_: Any) -> LoadedModel:
        """The loaded model of `task`, with its serving `facts` and the backend's fields."""
        return cls(task=task.name, facts=dict(facts), **fields_)

    def _own(self, key: str) -> bool:
        return key != "facts" and key in _FIELDS

    def __getitem__(self, key: str) -> Any:
        if self._own(key):
            return getattr(self, key)
        return self.facts[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if self._own(key):
            setattr(self, key, value)
        else:
            self.facts[key] = value

    def __delitem__(self, key: str) -> None:
        if self._own(key):
            raise KeyError(f"{key} is a field of the loaded model: it cannot be removed")
        del self.facts[key]

    def __iter__(self) -> Iterator[str]:
        yield from (name for name in _FIELDS if name != "facts")
        yield from self.facts

    def __len__(self) -> int:
        return len(_FIELDS) - 1 + len(self.facts)


_FIELDS = tuple(f.name for f in fields(LoadedModel) if f.name != "upgrade")  # (the mapping's keys: no upgrade)


def in_background(load: Callable[[], LoadedModel], name: str) -> Future:
    """`load()` run on a daemon thread of its own (a server stopping never waits for it), as a Future."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(load())
        except BaseException as err:  # (a failed load is settle's to report)
            future.set_exception(err)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
