"""Sparse embedding models trained end to end: the real `byoc train` (task=sparse) on (anchor, positive,
negative) rows from a plain masked language model, SPLADE's loss; the folder it writes (code/ included) is a
SparseEncoder folder that sentence-transformers loads, and `byoc serve` answers its terms as
`SparseEncoder.encode` gives them, on torch and on the graph the job exported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from byoc import compat
from byoc.tasks.sparse_embedding import model as sparse
from byoc.training import entry
from helpers import build_tiny_mlm, own_inference, topic_rows, write_jsonl

# A real job (not in make test-fast); the served terms compared with SparseEncoder's on the CPU.
pytestmark = [pytest.mark.integration, pytest.mark.cpu]

QUICK = {"max_steps": "6", "logging_steps": "2", "per_device_train_batch_size": "8", "task": "sparse"}


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def served_terms(model_dir: Path, monkeypatch, backend: str, texts: list[str]) -> list[list[dict]]:
    """The answers of the model's own code/inference.py (as SageMaker loads it) to `{"inputs": texts}`."""
    inference, model = own_inference(model_dir, monkeypatch, backend)
    assert model["backend"] == backend
    data = inference.input_fn(json.dumps({"inputs": texts}), "application/json")
    return json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0])


def test_a_sparse_job_trains_splade_and_its_folder_serves_sparse_encoders_terms(
    job, tiny_model_dir, tmp_path, monkeypatch
):
    job.hyperparameters({**QUICK, "learning_rate": "1e-3"})
    job.model_channel(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm"))
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(24, seed=1, negatives=True))
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    assert metrics["task"] == "sparse_embedding"
    assert 0 < metrics["eval_active_dims"] <= 30522 and 0 <= metrics["eval_mrr_at_10"] <= 1
    folder = job.model_dir
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert settings["model_type"] == "SparseEncoder"
    assert (folder / "model.onnx").is_file()  # the job's serving graph, SPLADE pooling inside

    SparseEncoder = compat.sparse_encoder_api()[0]
    texts = [row["anchor"] for row in topic_rows(4, seed=3)]
    expected = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    for backend in ("torch", "onnxruntime"):
        for terms, row in zip(served_terms(folder, monkeypatch, backend, texts), expected):
            got = np.zeros_like(row)
            for term in terms:
                got[term["index"]] = term["value"]
            np.testing.assert_allclose(got, row, rtol=1e-4, atol=1e-5)


def test_the_loss_is_splades_ranking_loss_plus_its_flops_regularisers(tiny_model_dir, tmp_path):
    """objective_loss computes from the vectors what SpladeLoss computes from the texts."""
    model = sparse.build(str(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm")), False, 32, {}, {})
    model.eval()  # no dropout: both sides see the same vectors
    features = model.model.tokenize(["a cat sat", "dogs bark", "rain falls"])
    pairs = model.model.tokenize(["the cat", "a dog", "the rain"])
    labels = torch.zeros(3)
    with torch.no_grad():
        ours = model.objective_loss([model.embed(**_feeds(features)), model.embed(**_feeds(pairs))], labels)
    with torch.no_grad():
        theirs = sum(model.__dict__["objective"]([features, pairs], labels).values())
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


def _feeds(features: dict) -> dict:
    return {"ids": features["input_ids"], "mask": features["attention_mask"], "types": features.get("token_type_ids")}


def test_mining_hard_negatives_for_a_sparse_job_is_refused_saying_what_to_do(tiny_model_dir, tmp_path):
    import datasets

    from byoc.training.arguments import HyperparameterError
    from byoc.training.data import TaskData
    from byoc.training.hyperparameters import parse_hyperparameters
    from byoc.training.negatives import mine_hard_negatives

    rows = topic_rows(8)
    train = datasets.Dataset.from_dict(
        {"text": [r["anchor"] for r in rows], "text_pair": [r["positive"] for r in rows]}
    )
    data = TaskData(train=train, eval=None, test=None, label_names=[], pretokenized=False, task="sparse_embedding")
    args = parse_hyperparameters({"mine_hard_negatives": "true", "task": "sparse"})
    with pytest.raises(HyperparameterError, match="give them as a negative column"):
        mine_hard_negatives(data, str(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm")), args)
