"""The model folder's format: what `byoc train` publishes to /opt/ml/model (the `model.tar.gz`) and
what `byoc serve` reads, and the one rule both sides apply to it (how long an input may be).

A model folder holds a Hugging Face classifier saved by `save_pretrained` (config.json with
id2label, model.safetensors), its tokenizer (tokenizer.json, tokenizer_config.json...), the
serving graphs (byoc.onnx_graph: model.onnx, optionally model.int8.onnx) and code/ (the
inference handlers, `code/inference.py`, and their requirements.txt).
"""

from __future__ import annotations

from typing import Any

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CODE_DIR = "code"

DEFAULT_MAX_LENGTH = 512  # when neither the tokenizer nor the model says
_UNKNOWN = 100_000  # tokenizers that do not know their limit report a huge number (1e30)


def max_length(*limits: Any) -> int:
    """The longest input, in tokens, that the model folder allows: the smallest of the limits it
    states (the tokenizer's model_max_length, the model's max_position_embeddings), ignoring the
    missing and the 'unknown' ones."""
    known = [int(n) for n in limits if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < _UNKNOWN]
    return min(known, default=DEFAULT_MAX_LENGTH)
