"""Sparse embedding models trained end to end: the real `byoc train` (task=sparse) on (anchor, positive,
negative) rows from a plain masked language model, SPLADE's loss; the folder it writes (code/ included) is a
SparseEncoder folder that sentence-transformers loads, and `byoc serve` answers its terms as
`SparseEncoder.encode` gives them, on torch and on the graph the job exported."""

from __future__ import annotations

import json
import shutil
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


def _feeds(features: dict, side: str = "document") -> dict:
    return {
        "ids": features["input_ids"],
        "mask": features["attention_mask"],
        "types": features.get("token_type_ids"),
        "side": side,
    }


# --- the inference-free kind: queries weighed by a table ---------------------------------------------------


def test_the_inference_free_loss_is_splades_on_texts_routed_as_sentence_transformers_routes_them(
    tiny_model_dir, tmp_path
):
    """Queries through the table (the job's rows, tokenized with special tokens, which embed masks out),
    documents through the transformer: SpladeLoss over sentence-transformers' own routed tokenization, with no
    FLOPS on the queries."""
    model = sparse.build(str(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm")), False, 32, {}, {})
    sparse.make_inference_free(model)
    table = sparse.static_table(model.model)
    with torch.no_grad():
        table.weight.copy_(torch.rand(table.weight.shape))  # (all 1 at the start: no test of the lookup)
    model.eval()
    queries, documents = ["a cat sat", "dogs bark", "rain falls"], ["the cat", "a dog", "the rain"]
    tokenizer = table.tokenizer
    ours = [model.embed(**_feeds(tokenizer(queries, padding=True, return_tensors="pt"), "query"))]
    ours.append(model.embed(**_feeds(tokenizer(documents, padding=True, return_tensors="pt"))))
    theirs = [
        model.model.encode_query(queries, convert_to_tensor=True).to_dense(),
        model.model.encode_document(documents, convert_to_tensor=True).to_dense(),
    ]
    for got, expected in zip(ours, theirs):
        torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)
    splade = model.__dict__["objective"]
    assert splade.query_regularizer_weight in (None, 0) and splade.document_regularizer_weight == 3e-3
    labels = torch.zeros(3)
    with torch.no_grad():
        loss = model.objective_loss(ours, labels)
        expected = splade.loss.compute_loss_from_embeddings(theirs, labels)
        expected += splade.document_regularizer.compute_loss_from_embeddings(theirs[1]) * 3e-3
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert model.learning_rates == {name: 1e-3 for name, _ in model.named_parameters() if ".sub_modules.query." in name}
    assert len(model.learning_rates) == 1


def test_an_inference_free_job_trains_its_table_and_its_folder_serves_queries_and_documents(
    job, tiny_model_dir, tmp_path, monkeypatch
):
    """`inference_free=true` from a masked language model: the job writes sentence-transformers' Router folder,
    its table trained (no longer all 1), served by the folder's own code equal to encode_query (no model run)
    and encode_document, on torch and on the graph; and a job from that folder trains it as it is."""
    job.hyperparameters({**QUICK, "inference_free": "true"})
    job.model_channel(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm"))
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(24, seed=1, negatives=True))
    assert entry.train() == 0, job.failure
    assert job.metrics["hyperparameters"]["inference_free"] is True and 0 <= job.metrics["eval_mrr_at_10"] <= 1

    folder = job.model_dir
    assert (folder / "router_config.json").is_file() and not (folder / "config.json").exists()
    ref = compat.sparse_encoder_api()[0](str(folder), device="cpu")
    weights = sparse.static_table(ref).weight.detach()
    # Trained at its own rate: AdamW moves a weight about the learning rate a step, so 6 steps at the job's
    # 5e-5 move none of the table's weights (all 1 at the start) by 1e-3.
    assert float((weights - 1).abs().max()) > 1e-3
    texts = [row["anchor"] for row in topic_rows(4, seed=3)]
    for backend in ("torch", "onnxruntime"):
        inference, model = own_inference(folder, monkeypatch, backend)
        for side, encode in (("query", ref.encode_query), ("document", ref.encode_document)):
            body = {"inputs": texts, "parameters": {"prompt_name": side}}
            answer = inference.predict_fn(inference.input_fn(json.dumps(body), "application/json"), model)
            served = json.loads(inference.output_fn(answer, "application/json")[0])
            for terms, row in zip(served, encode(texts, convert_to_tensor=True).to_dense().numpy()):
                got = np.zeros_like(row)
                for term in terms:
                    got[term["index"]] = term["value"]
                np.testing.assert_allclose(got, row, rtol=1e-4, atol=1e-5, err_msg=f"{backend} {side}")
        sys.modules.pop("inference", None)

    shutil.copytree(folder, tmp_path / "trained")
    shutil.rmtree(job.channel("model"))
    shutil.rmtree(job.model_dir)
    job.model_dir.mkdir()
    job.hyperparameters(QUICK)  # no inference_free: the model channel's Router says it
    job.model_channel(tmp_path / "trained")
    assert entry.train() == 0, job.failure
    assert (job.model_dir / "router_config.json").is_file()


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
    # The two settings alone decide it: refused as they are read, before any data (round six)...
    with pytest.raises(
        HyperparameterError, match="task=sparse_embedding and mine_hard_negatives=true: .* negative column"
    ):
        parse_hyperparameters({"mine_hard_negatives": "true", "task": "sparse"})
    # ...and by the miner itself where the task comes from the data (task=auto)
    args = parse_hyperparameters({"mine_hard_negatives": "true"})
    with pytest.raises(HyperparameterError, match="give them as a negative column"):
        mine_hard_negatives(data, str(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm")), args)
