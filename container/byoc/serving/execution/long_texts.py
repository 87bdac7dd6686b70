"""Long texts a task reads whole (a token classifier's), run a few windows at a time so that other requests
run in between.

Every window of such a text runs (`Head.windows`: byoc.tasks.token_classification.head): a text of 50,000
characters is seconds of work on a small model and tens of seconds on BERT-base. Run as one call it would hold
the inference thread all that time, every other request waiting behind it. Instead the request runs in steps on
the inference thread: its texts' windows first (the tokenizer), then the windows a few at a time, then the
answers; the batches of other requests queue on the same thread meanwhile and run between the steps. The
windows are the ones one call makes, so the answers are the same as one call's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

from byoc import tasks
from byoc.serving.backends import passes
from byoc.serving.protocol import task_parameters

# Requests with more characters than this run in steps (a few windows of a 512-token model at most):
# fewer are one ordinary batched call.
STEPWISE_CHARS = 2048
STEP_TOKENS = 1024  # the windows of one step: a fraction of a second of MiniLM, about 2 s of BERT-base on 2 cores


def reads_whole(model: Any) -> bool:
    """Whether the model (as the default model_fn loads it) reads each text whole, in windows (its task's
    `whole_texts`: a token classifier): one whole text an input."""
    task = tasks.TASKS.get(model.get("task", "")) if isinstance(model, Mapping) else None
    return task is not None and task.head.whole_texts


def whole_text_chars(model: Any, data: Any) -> int:
    """The characters of text the default predict_fn reads whole in this request: a token classifier's texts
    (every window of a long text runs), 0 for a model that cuts each text at its max_length."""
    if not reads_whole(model) or not isinstance(data, dict):
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
    gives each text's answer, as the task's `windows` give it in one call."""

    def __init__(self, inputs: list[Any], parameters: dict[str, Any], model: dict[str, Any]) -> None:
        self.task = tasks.TASKS[model["task"]]
        task_parameters.check_task(self.task, parameters)  # (as the default predict_fn checks them)
        try:
            self.request = self.task.head.windows(inputs, parameters, model)
        except tasks.BadParameter as err:
            raise task_parameters.refused(err) from None
        self.texts: list[Any] = inputs
        self.model = model
        self.scores: list[np.ndarray] = []

    def steps(self) -> Iterator[Callable[[], None]]:
        """The tokenizer's step, then the windows' (known once the first has run)."""
        yield self.request.encode
        feeds = self.request.feeds
        start = 0
        while start < len(feeds):
            end, size = start, 0
            while end < len(feeds) and (end == start or size + len(feeds[end]["input_ids"]) <= STEP_TOKENS):
                size += len(feeds[end]["input_ids"])
                end += 1
            yield partial(self._score, feeds[start:end])
            start = end

    def _score(self, feeds: list[dict]) -> None:
        self.scores.extend(passes.run(feeds, self.model, self.task.scores))

    def answers(self) -> list[Any]:
        try:
            return self.request.answers(self.scores)
        except tasks.BadParameter as err:  # (an answer over the server's limit: a 413)
            raise task_parameters.refused(err) from None
