"""The model folder's format: what `byoc train` publishes to /opt/ml/model (the `model.tar.gz`) and
what `byoc serve` reads, and the one rule both sides apply to it (how long an input may be).

A model folder holds a Hugging Face classifier saved by `save_pretrained` (config.json with
id2label, model.safetensors), its tokenizer (tokenizer.json, tokenizer_config.json...), the
serving graphs (byoc.onnx_graph: model.onnx, optionally model.int8.onnx) and code/ (the
inference handlers, `code/inference.py`, and their requirements.txt).

config.json's `problem_type` names the task (transformers' names, which pick the loss in training
and the scores in serving): one label per text (softmax), several (sigmoid, with the decision
`byoc_threshold` saved beside it, and `byoc_thresholds` for labels with their own), or a number
(regression, one output); a token classifier (a tag per token: NER) is named by its architecture
(`...ForTokenClassification`), with `byoc_word_tags` saved beside it: how training tagged a word's
sub-tokens, which picks serving's default entities.
"""

from __future__ import annotations

from typing import Any

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CODE_DIR = "code"

SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
REGRESSION = "regression"
TOKEN_CLASSIFICATION = "token_classification"
TASKS = (SINGLE_LABEL, MULTI_LABEL, REGRESSION, TOKEN_CLASSIFICATION)
# Short names users write for the tasks (the `task` hyperparameter).
TASK_ALIASES = {
    "single_label": SINGLE_LABEL,
    "single": SINGLE_LABEL,
    "classification": SINGLE_LABEL,
    "multi_label": MULTI_LABEL,
    "multilabel": MULTI_LABEL,
    "multi": MULTI_LABEL,
    "regress": REGRESSION,
    "token": TOKEN_CLASSIFICATION,
    "ner": TOKEN_CLASSIFICATION,
}
THRESHOLD_KEY = "byoc_threshold"  # config.json: a multi-label model's decision threshold
DEFAULT_THRESHOLD = 0.5
THRESHOLDS_KEY = "byoc_thresholds"  # config.json: {label: threshold} for labels with their own (training.thresholds)
# config.json: where a token classifier was trained on each word's tag: "first" (its first sub-token)
# or "all" (every sub-token: label_all_tokens). Absent in models byoc did not train.
WORD_TAGS_KEY = "byoc_word_tags"
WORD_TAGS = ("first", "all")

DEFAULT_MAX_LENGTH = 512  # when neither the tokenizer nor the model says
_UNKNOWN = 100_000  # tokenizers that do not know their limit report a huge number (1e30)


def max_length(*limits: Any) -> int:
    """The longest input, in tokens, that the model folder allows: the smallest of the limits it
    states (the tokenizer's model_max_length, the model's max_position_embeddings), ignoring the
    missing and the 'unknown' ones."""
    known = [int(n) for n in limits if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < _UNKNOWN]
    return min(known, default=DEFAULT_MAX_LENGTH)


def task_name(value: str) -> str | None:
    """The canonical task for a name or alias (case and '-' insensitive), or None if it names none."""
    key = value.strip().lower().replace("-", "_")
    return key if key in TASKS else TASK_ALIASES.get(key)


def task_of(config: dict[str, Any]) -> str:
    """The task a saved config.json was trained for. A token classifier says so by its architecture
    (transformers' problem_type names only sequence tasks); transformers leaves `problem_type` unset
    until the first forward pass with labels; then one output means regression, more a single-label classifier."""
    if any(str(a).endswith("ForTokenClassification") for a in config.get("architectures") or ()):
        return TOKEN_CLASSIFICATION
    stated = config.get("problem_type")
    if stated in TASKS:
        return str(stated)
    return REGRESSION if int(config.get("num_labels") or len(config.get("id2label") or {}) or 2) == 1 else SINGLE_LABEL


def model_class(task: str) -> str:
    """The transformers Auto class that loads a model of `task`."""
    return "AutoModelForTokenClassification" if task == TOKEN_CLASSIFICATION else "AutoModelForSequenceClassification"


def threshold_of(config: dict[str, Any]) -> float:
    """A multi-label model's decision threshold (config.json's byoc_threshold, else 0.5)."""
    value = config.get(THRESHOLD_KEY, DEFAULT_THRESHOLD)
    return float(value) if isinstance(value, (int, float)) and 0 <= value <= 1 else DEFAULT_THRESHOLD


def thresholds_of(config: dict[str, Any]) -> list[float] | None:
    """A multi-label model's per-label thresholds in label-id order (config.json's byoc_thresholds), NaN
    for a label without its own (it takes byoc_threshold); None where no label has one."""
    own, id2label = config.get(THRESHOLDS_KEY), config.get("id2label") or {}
    if not isinstance(own, dict) or not own:
        return None
    names = [id2label[key] for key in sorted(id2label, key=int)]
    return [_probability(own.get(name)) for name in names]


def _probability(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    return float(value) if ok else float("nan")


def word_tags_of(config: dict[str, Any]) -> str | None:
    """How a token classifier was trained on a word's sub-tokens (config.json's byoc_word_tags), or None
    where the model does not say (trained before byoc saved it, or by another tool)."""
    value = config.get(WORD_TAGS_KEY)
    return value if value in WORD_TAGS else None
