"""`byoc.inference`, public API: the default inference handlers, which every model's
`code/inference.py` imports (`from byoc.inference import input_fn, model_fn, output_fn`) and
overrides one of; models already trained carry that import, so the names below stay. The handlers
live in byoc.serving.default_pipeline; this module re-exports them, the same objects, by name."""

from byoc.serving.default_pipeline import (
    ACCEPT_TYPES,
    CONTENT_TYPES,
    input_fn,
    model_fn,
    output_fn,
    predict_fn,
)

__all__ = ["model_fn", "input_fn", "predict_fn", "output_fn", "CONTENT_TYPES", "ACCEPT_TYPES"]
