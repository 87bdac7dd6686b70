"""A request's parameters for the default predict_fn: each one's value checked, and each task's own.

A parameter byoc knows that the model's task does not use (`top_k` of a token classifier, `threshold`
of a regression model) is a 400 naming the parameters the task takes: answering as if it had been
applied would mislead the client. A parameter byoc does not know passes unread, as before (clients of
the Hugging Face inference DLC send some of their own, such as `truncation`).
"""

from __future__ import annotations

from typing import Any

from byoc import tasks
from byoc.serving.model.request_errors import InputError

KNOWN = ("top_k", "threshold", "aggregation_strategy")  # each task's own: byoc.tasks' `parameters`


def check_values(parameters: dict[str, Any]) -> None:
    """top_k and threshold, whatever the task (aggregation_strategy: byoc.serving.model.entities)."""
    top_k, threshold = parameters.get("top_k"), parameters.get("threshold")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise InputError('"top_k" must be a positive integer')
    if threshold is not None and (
        not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 <= threshold <= 1
    ):
        raise InputError('"threshold" must be a number from 0 to 1 (a multi-label score at or above it is a label)')


def check_task(task: tasks.Task | None, parameters: dict[str, Any]) -> None:
    """A 400 for a parameter of byoc's that `task` does not take (null counts as not sent). No task: a
    model of the user's own making, whose parameters are its code's business."""
    if task is None:
        return
    for name in KNOWN:
        if parameters.get(name) is not None and name not in task.parameters:
            takes = task.parameters
            accepted = f"its parameters are {', '.join(takes)}" if takes else "it takes no parameters"
            raise InputError(f'"{name}" does not apply to {task.described}: {accepted}')
