"""An 8,192-token model trained and served to its length: a tiny ModernBERT with 8,192 positions (the shape of
ModernBERT-base's, its tokenizer's limit as long), a job of `max_length=8192` on texts longer than that, and the
folder it wrote serving a text cut at 8,192 tokens, not at a fixed smaller limit."""

from __future__ import annotations

import json
import sys

import architectures
import pytest

from byoc.training import entry
from helpers import own_inference, write_jsonl

pytestmark = pytest.mark.integration  # a real job

LONG = 8192


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


@pytest.fixture
def long_model(tmp_path):
    """architectures' tiny ModernBERT, its positions and its tokenizer's limit raised to 8,192."""
    import torch
    import transformers

    folder = architectures.build("modernbert", tmp_path / "modernbert")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": LONG}))
    config = transformers.AutoConfig.from_pretrained(folder)
    config.max_position_embeddings = LONG
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(folder)
    return folder


def test_a_job_trains_to_8192_tokens_and_its_folder_serves_to_them(job, long_model, monkeypatch, caplog):
    long_text = " ".join(f"rain{i % 7} falls on the hills" for i in range(2500))  # past 8,192 tokens
    long, short = {"text": long_text, "label": "long"}, {"text": "a short text", "label": "short"}
    rows = [long if i % 2 else short for i in range(8)]
    job.hyperparameters(
        {"max_length": str(LONG), "max_steps": "2", "per_device_train_batch_size": "2", "logging_steps": "1"}
    )
    job.model_channel(long_model)
    write_jsonl(job.channel("train") / "train.jsonl", rows)
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any(f"truncated at {LONG}" in r.getMessage() for r in caplog.records)
    written = json.loads((job.model_dir / "tokenizer_config.json").read_text())
    assert written["model_max_length"] == LONG  # serving cuts where training did
    inference, model = own_inference(job.model_dir, monkeypatch, "torch")
    assert model["max_length"] == LONG
    encoded = model["encode"]([long_text])[0]
    assert len(encoded["input_ids"]) == LONG  # the whole length read, not a fixed smaller limit
    data = inference.input_fn(json.dumps({"inputs": [long_text, "short text"]}), "application/json")
    answers = inference.predict_fn(data, model)
    assert [a["label"] in ("long", "short") for a in answers] == [True, True]
