"""This model's inference code: byoc's default handlers, predict_fn ready to change.

`byoc serve` calls `model_fn(model_dir)`, `input_fn(body, content_type)`, `predict_fn(data, model)`
and `output_fn(prediction, accept)` (the AWS inference toolkits' contract), or one
`transform_fn(model, body, content_type, accept)`. The defaults come from `byoc.inference`, in the
image; define any handler here to replace it. Every trained model carries this file as
`model/code/inference.py`: change it there, or here before training; list extra packages in
requirements.txt beside it. Raise byoc.handlers.InputError (400) for a bad request.

As shipped, unchanged, this file serves exactly as the defaults do (the server knows it). Once changed,
your predict_fn runs for every request; the server still applies its limits on each request's inputs and
text, and builds a rerank or OpenAI body's answer from the answers your predict_fn returns, so pass
those on in the same form (a number per pair; a vector per text).
"""

from typing import Any

from byoc import inference as defaults
from byoc.inference import input_fn, model_fn, output_fn

__all__ = ["model_fn", "input_fn", "predict_fn", "output_fn"]  # the handlers; all but predict_fn are the defaults


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    """data: {"inputs": [text or (text, text_pair)], "parameters": {...}} ("shape": "rerank" or "openai" for
    those bodies); model: what model_fn returned.

    Returns one answer per input, in order, as the model's task answers: {"label", "score"} (or the top_k
    of them) for a classifier, its labels for a multi-label one, {"score"} for regression, the entities of
    a token classifier, a vector for an embedding model; a pair's relevance for a rerank body; for an
    OpenAI body each text's `Embedded` (its .vector, and the .tokens it ran).
    """
    answers = defaults.predict_fn(data, model)
    # Change the answers here, e.g. map labels to your own names or hide low scores.
    return answers


# The server merges concurrent requests into one predict_fn call only when this is True: keep it while
# predict_fn takes a list of inputs and returns one answer per input, in order; set it to False otherwise.
predict_fn.batchable = True
