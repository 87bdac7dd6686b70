"""byoc.tasks.generative_reranker: a decoder scored by its yes/no logits (sentence-transformers' LogitScore),
fine-tuned on (query, positive, negative) rows with binary cross-entropy, LoRA or whole, and written as the
CrossEncoder folder that `byoc serve` serves and sentence-transformers loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import generative_rerankers
import numpy as np
import pytest
import torch

from byoc import tasks
from byoc.serving.protocol import outputs
from byoc.tasks.base import BadParameter
from byoc.tasks.generative_reranker import template
from byoc.training import entry
from helpers import own_inference, topic_rows, write_jsonl

pytestmark = pytest.mark.cpu  # scores compared with the reference on the CPU at fp32

GENERATIVE = tasks.get(tasks.GENERATIVE_RERANKER)
QUICK = {
    "task": "generative_reranker",
    "max_steps": "6",
    "logging_steps": "2",
    "per_device_train_batch_size": "4",
    "learning_rate": "1e-3",
    "device": "cpu",
}
PAIRS = [("will it rain", "rain tomorrow afternoon"), ("how to bake bread", "the final whistle blew")]


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


@pytest.fixture(scope="module", params=generative_rerankers.LAYOUTS)
def folder(request, tmp_path_factory) -> Path:
    return generative_rerankers.build(request.param, tmp_path_factory.mktemp(request.param) / "model")


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_training_models_logit_is_the_layouts_score(folder, side):
    """The job's model scores a batch, padded on either side, as the layout defines the score."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = side
    model = GENERATIVE.recipe.training_model(str(folder), ["label"], {}, {}, False, 512, 1).eval()
    encoded = GENERATIVE.rows.encoder(tokenizer, 512, False, ["label"], False, True)(
        {"text": [q for q, _ in PAIRS], "text_pair": [d for _, d in PAIRS], "label": [1.0, 0.0]}
    )
    batch = tokenizer.pad({k: encoded[k] for k in ("input_ids", "attention_mask")}, return_tensors="pt")
    assert (batch["attention_mask"][:, 0 if side == "left" else -1] == 0).any()  # (padded on that side)
    with torch.no_grad():
        logits = model(**batch).logits.reshape(-1).numpy()
    np.testing.assert_allclose(logits, generative_rerankers.reference_logits(folder, PAIRS), atol=1e-4)


def test_a_pair_cut_at_the_length_ends_with_the_templates_tail(folder):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    renderer = template.of_tokenizer(tokenizer)
    whole = template.encode_pairs(tokenizer, renderer, [("q", "short")], 512)["input_ids"][0]
    cut = template.encode_pairs(tokenizer, renderer, [("q", "rain falls " * 400)], 128)["input_ids"][0]
    suffix = renderer.suffix(lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert len(cut) == 128 and 0 < len(suffix) < 40
    assert cut[-len(suffix) :] == suffix == whole[-len(suffix) :]


def test_a_tokenizer_without_a_template_is_refused_saying_how_to_add_one(folder, tmp_path):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = None
    with pytest.raises(BadParameter, match="the model's tokenizer has none: save one with it"):
        GENERATIVE.rows.encoder(tokenizer, 128, False, ["label"], False, True)


@pytest.mark.integration
@pytest.mark.parametrize("lora", [False, True], ids=["whole", "lora"])
def test_a_job_fine_tunes_it_and_serves_what_it_wrote(job, folder, monkeypatch, lora):
    job.hyperparameters({**QUICK, **({"lora_r": "4"} if lora else {})})
    job.model_channel(folder)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(24, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(8, seed=1, negatives=True))
    assert entry.train() == 0, job.failure
    metrics = job.metrics
    assert metrics["task"] == tasks.GENERATIVE_RERANKER and 0 <= metrics["eval_average_precision"] <= 1
    written = job.model_dir
    assert tasks.of_folder(written, json.loads((written / "config.json").read_text())).name == GENERATIVE.name
    assert json.loads((written / "modules.json").read_text())[1]["path"] == "1_LogitScore"
    from safetensors import safe_open

    with safe_open(str(written / "model.safetensors"), framework="pt") as weights:
        assert not [k for k in weights.keys() if "lora" in k]  # (adapters merged: a plain folder)
    before = generative_rerankers.reference_logits(folder, PAIRS)
    expected = generative_rerankers.reference_logits(written, PAIRS)
    assert np.abs(np.subtract(expected, before)).max() > 1e-4  # the job moved the scores
    query, texts = PAIRS[0][0], [d for _, d in PAIRS]
    for backend in ("torch", "onnxruntime"):
        inference, model = own_inference(written, monkeypatch, backend)
        data = inference.input_fn(json.dumps({"query": query, "texts": texts, "raw_scores": True}), "application/json")
        answer = outputs.shaped(data, inference.predict_fn(data, model))
        served = [item["score"] for item in sorted(answer, key=lambda item: item["index"])]
        reference = generative_rerankers.reference_logits(written, [(query, t) for t in texts])
        np.testing.assert_allclose(served, reference, atol=1e-4)


@pytest.mark.integration
def test_a_generative_reranker_trained_as_a_classifier_is_refused_naming_its_task(job, folder):
    job.hyperparameters({**QUICK, "task": "reranker"})
    job.model_channel(folder)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(8, negatives=True))
    assert entry.train() != 0
    assert "train it with task=generative_reranker" in job.failure


def test_a_long_query_is_cut_to_what_the_model_reads_before_it_is_rendered(folder):
    """A 5.4 MB query was rendered whole into the template once a document (2.6 s and 810 MB for 128 of them)
    before the tokenizer cut it. Each side is cut to the characters the model can read first, as a cross-encoder's
    texts are: the scores are the same."""
    from byoc.serving import default_pipeline
    from byoc.serving.settings import InferenceSettings

    with default_pipeline.serving_with(InferenceSettings(backend="torch", precision="fp32")):
        model = default_pipeline.model_fn(str(folder))
    renderer, rendered = model["renderer"], []
    render = renderer.render
    renderer.render = lambda query, document, system=None: (
        rendered.append(len(query) + len(document)) or render(query, document, system)
    )
    most = tasks.limits.CHARS_PER_TOKEN * model["max_length"]
    query, documents = "will it rain " * 100_000, ["rain tomorrow afternoon", "the final whistle blew"]

    def scores(q: str) -> list:
        body = {"query": q, "texts": documents, "raw_scores": True}
        return default_pipeline.predict_fn(default_pipeline.input_fn(json.dumps(body)), model)

    long = scores(query)
    assert rendered and max(rendered) <= most + max(map(len, documents))
    np.testing.assert_allclose(long, scores(query[:most]), atol=1e-6)
