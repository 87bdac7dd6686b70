"""`byoc.inference`: the default inference handlers at the path every model's `code/inference.py`
imports them from (models already trained carry that import). They live in
byoc.serving.default_handlers; this module only re-exports them, the same objects."""

from byoc.serving.default_handlers import *  # noqa: F403
from byoc.serving.default_handlers import input_fn, model_fn, output_fn, predict_fn

__all__ = ["model_fn", "input_fn", "predict_fn", "output_fn"]
