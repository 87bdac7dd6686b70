"""A token classifier's long texts, run a few windows at a time so that other requests run in between.

Every window of a text runs (byoc.serving.user_code.entities): a text of 50,000 characters is seconds of
work on a small model and tens of seconds on BERT-base. Run as one call it would hold the inference
thread all that time, every other request waiting behind it. Instead the request runs in steps on the
inference thread: its texts' windows first (the tokenizer), then the windows a few at a time, then the
entities; the batches of other requests queue on the same thread meanwhile and run between the steps.
The windows are the ones one call makes, so the answers are the same as one call's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

from byoc import tasks
from byoc.serving.user_code import entities

# Requests with more characters than this run in steps (a few windows of a 512-token model at most):
# fewer are one ordinary batched call.
STEPWISE_CHARS = 2048
STEP_TOKENS = 1024  # the windows of one step: a fraction of a second of MiniLM, about 2 s of BERT-base on 2 cores


def token_classifier(model: Any) -> bool:
    """Whether the model (as the default model_fn loads it) is a token classifier: one whole text an input."""
    return isinstance(model, Mapping) and getattr(tasks.TASKS.get(model.get("task", "")), "per_token", False)


def whole_text_chars(model: Any, data: Any) -> int:
    """The characters of text the default predict_fn reads whole in this request: a token classifier's texts
    (every window of a long text runs), 0 for a model that cuts each text at its max_length."""
    if not token_classifier(model) or not isinstance(data, dict):
        return 0
    inputs = data.get("inputs")
    texts = inputs if isinstance(inputs, list) else [inputs]
    return sum(len(text) for text in texts if isinstance(text, str))


def stepwise(model: Any, data: Any) -> Stepwise | None:
    """The request as a `Stepwise` where the default predict_fn would hold the inference thread for its
    texts (a token classifier's, over STEPWISE_CHARS); else None (an ordinary batched call)."""
    if whole_text_chars(model, data) <= STEPWISE_CHARS:
        return None
    inputs = data["inputs"]
    return Stepwise(inputs if isinstance(inputs, list) else [inputs], data.get("parameters") or {}, model)


class Stepwise:
    """One request's texts: run each of `steps()` in the inference thread, one at a time, then `answers()`
    gives each text's entities, as `entities.predict` would."""

    def __init__(self, inputs: list[Any], parameters: dict[str, Any], model: dict[str, Any]) -> None:
        self.strategy = entities.checked(inputs, parameters, model.get("aggregation", entities.DEFAULT_STRATEGY))
        self.texts: list[str] = inputs
        self.model = model
        self.windows: list[list[dict]] = []
        self.scores: list[np.ndarray] = []

    def steps(self) -> Iterator[Callable[[], None]]:
        """The tokenizer's step, then the windows' (known once the first has run)."""
        yield self._encode
        feeds = [window["feeds"] for windows in self.windows for window in windows]
        start = 0
        while start < len(feeds):
            end, size = start, 0
            while end < len(feeds) and (end == start or size + len(feeds[end]["input_ids"]) <= STEP_TOKENS):
                size += len(feeds[end]["input_ids"])
                end += 1
            yield partial(self._score, feeds[start:end])
            start = end

    def _score(self, feeds: list[dict]) -> None:
        self.scores.extend(entities.scores_of(feeds, self.model))

    def _encode(self) -> None:
        self.windows = self.model["windows"](self.texts)

    def answers(self) -> list[list[dict[str, Any]]]:
        per_text = entities.merged(self.windows, self.scores)
        return [
            entities.answer(text, tokens, self.model["id2label"], self.strategy)
            for text, tokens in zip(self.texts, per_text)
        ]
