"""A request's parameters for the default predict_fn: each one's value checked, and each task's own.

A parameter byoc knows that the model's task does not use (`top_k` of a token classifier, `threshold`
of a regression model) is a 400 naming the parameters the task takes: answering as if it had been
applied would mislead the client. A parameter byoc does not know passes unread, as before (clients of
the Hugging Face inference DLC send some of their own, such as `truncation`).
"""

from __future__ import annotations

from typing import Any

from byoc import tasks
from byoc.serving.protocol.request_errors import InputError, PayloadTooLarge

KNOWN = tuple(dict.fromkeys(name for task in tasks.TASKS.values() for name in task.head.parameters))  # tasks' own
# A rerank request's (TEI's {"query", "texts"}: the body's form makes its shape "rerank",
# byoc.serving.protocol.bodies), for any task that reranks (`Head.relevance`). TEI's "truncate" is read and
# needs nothing: byoc always truncates an input at the model's limit, on the right unless the request's
# "truncation_direction" says "left" (predict_fn: a task that reads texts in windows refuses it).
RERANK = ("raw_scores", "return_text", "top_n")


def check_values(parameters: dict[str, Any]) -> None:
    """Each parameter byoc knows, whatever the task. A task's own values (`Head.check_values`) are checked by
    `check_task` once the model's task is known: the same name may take other values in another task (a
    multi-vector model's "prompt_name" is "query" or "document"; an embedding model's, any of its prompts)."""
    threshold = parameters.get("threshold")
    for name in ("top_k", "top_n", "dimensions"):
        value = parameters.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(f'"{name}" must be a positive integer')
    if threshold is not None and (
        not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 <= threshold <= 1
    ):
        raise InputError('"threshold" must be a number from 0 to 1 (a multi-label score at or above it is a label)')
    for name in ("normalize", "raw_scores", "return_text", "truncate"):
        if parameters.get(name) is not None and not isinstance(parameters[name], bool):
            raise InputError(f'"{name}" must be true or false')
    if parameters.get("prompt_name") is not None and not isinstance(parameters["prompt_name"], str):
        raise InputError('"prompt_name" must be the name of one of the model\'s prompts')
    direction = parameters.get("truncation_direction")
    if direction is not None and str(direction).lower() not in ("left", "right"):
        raise InputError(
            '"truncation_direction" is "right" (a text past the model\'s length loses its end, the default) or '
            f'"left" (its start); got {direction!r}'
        )


def check_task(task: tasks.Task | None, parameters: dict[str, Any], shape: str | None = None) -> None:
    """A 400 for a parameter of byoc's that `task` does not take (null counts as not sent) or a value of one
    it does not take (`Head.check_values`), for a rerank parameter outside a rerank request, and for a body's
    form (`shape`: the request's, from byoc.serving.protocol.bodies) the task cannot answer. No task: a model of
    the user's own making, whose parameters are its code's business."""
    if task is None:
        return
    reranking = shape == "rerank"
    try:
        task.head.check_shape(shape)
    except tasks.BadParameter as err:
        raise InputError(str(err)) from None
    takes = task.head.rerank_parameters if reranking else task.head.parameters
    for name in KNOWN:
        if parameters.get(name) is not None and name not in takes:
            accepted = f"its parameters are {', '.join(takes)}" if takes else "it takes no parameters"
            raise InputError(
                f'"{name}" does not apply to {"a rerank request" if reranking else task.described}: {accepted}'
            )
    if str(parameters.get("truncation_direction") or "").lower() == "left" and task.head.whole_texts:
        raise InputError(
            f'"truncation_direction": "left" does not apply to {task.described}: it reads every text whole, in '
            "windows, and cuts none: drop it"
        )
    for name in RERANK:
        if parameters.get(name) is not None and not reranking:
            raise InputError(f'"{name}" applies to rerank requests ({{"query": ..., "texts": [...]}}) only')
    try:
        task.head.check_values(parameters)
    except tasks.BadParameter as err:
        raise InputError(str(err)) from None


def refused(err: tasks.BadParameter) -> InputError:
    """The request error for what a task refused: a 413 for an answer over the server's limit, else a 400."""
    return PayloadTooLarge(str(err)) if isinstance(err, tasks.AnswerTooLarge) else InputError(str(err))
