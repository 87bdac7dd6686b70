"""This model's inference code: byoc's default handlers for a text classifier, one of them overridden.

`byoc serve` calls `model_fn(model_dir)`, `input_fn(body, content_type)`, `predict_fn(data, model)`
and `output_fn(prediction, accept)` (the AWS inference toolkits' contract), or one
`transform_fn(model, body, content_type, accept)`. The defaults come from `byoc.inference`, in the
image; define any handler here to replace it. Every trained model carries this file as
`model/code/inference.py`: change it there, or here before training; list extra packages in
requirements.txt beside it. Raise byoc.handlers.InputError (400) for a bad request.
"""

from typing import Any

from byoc import inference as defaults
from byoc.inference import input_fn, model_fn, output_fn

__all__ = ["model_fn", "input_fn", "predict_fn", "output_fn"]  # the handlers; all but predict_fn are the defaults


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    """data: {"inputs": [text or (text, text_pair)], "parameters": {"top_k": ...}}; model: what model_fn returned.

    Returns one answer per input, in order: {"label", "score"}, or a list of the top_k of them.
    """
    answers = defaults.predict_fn(data, model)
    # Change the answers here, e.g. map labels to your own names or hide low scores.
    return answers


# The server merges concurrent requests into one predict_fn call only when this is True: keep it while
# predict_fn takes a list of inputs and returns one answer per input, in order; set it to False otherwise.
predict_fn.batchable = True
