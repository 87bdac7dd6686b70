"""byoc.tasks.reranker: a cross-encoder trained as sentence-transformers' CrossEncoder trainer trains one (binary
cross-entropy on positive pairs and mined or given negatives), written as a folder CrossEncoder loads and
`byoc serve` reranks with."""

from __future__ import annotations

import json
import sys

import datasets
import numpy as np
import pytest
import torch

from byoc import tasks
from byoc.serving.protocol import outputs
from byoc.tasks.base import BadParameter
from byoc.training import entry
from byoc.training.trainer import masked_loss
from helpers import build_tiny_bert, own_inference, topic_rows, write_jsonl

RERANKER = tasks.get(tasks.RERANKER)
QUICK = {"max_steps": "6", "logging_steps": "2", "per_device_train_batch_size": "8", "task": "reranker"}


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def rows(negatives: bool) -> datasets.Dataset:
    columns = {"text": ["q1", "q2"], "text_pair": ["p1", "p2"], "label": [float("nan")] * 2}
    if negatives:
        columns["text_negative"] = ["n1", "n2"]
    return datasets.Dataset.from_dict(columns)


def test_each_row_gives_a_relevant_pair_and_an_irrelevant_one_per_negative():
    pairs = RERANKER.rows.pairs_of_rows(rows(negatives=True), "train")
    assert list(zip(pairs["text"], pairs["text_pair"], pairs["label"])) == [
        ("q1", "p1", 1.0),
        ("q1", "n1", 0.0),
        ("q2", "p2", 1.0),
        ("q2", "n2", 0.0),
    ]
    # An eval split may have no negative: its positive pairs are still scored.
    assert RERANKER.rows.pairs_of_rows(rows(negatives=False), "eval")["label"] == [1.0, 1.0]
    with pytest.raises(BadParameter, match="no negative, and a reranker learns from negatives: set mine_hard_neg"):
        RERANKER.rows.pairs_of_rows(rows(negatives=False), "train")


def test_scored_pairs_are_kept_where_the_scores_are_relevances():
    scored = datasets.Dataset.from_dict({"text": ["a", "b"], "text_pair": ["c", "d"], "label": [0.0, 0.75]})
    assert RERANKER.rows.pairs_of_rows(scored, "train") is scored
    out_of_range = datasets.Dataset.from_dict({"text": ["a", "b"], "text_pair": ["c", "d"], "label": [1.0, 5.0]})
    with pytest.raises(BadParameter, match=r"scores run 1..5, and a reranker learns a relevance from 0 to 1"):
        RERANKER.rows.pairs_of_rows(out_of_range, "train")


def test_the_loss_is_sentence_transformers_binary_cross_entropy(tmp_path):
    """The job's loss (Trainer.compute_loss's masked mean of row_loss) on a cross-encoder's logits equals
    sentence-transformers' BinaryCrossEntropyLoss on the same CrossEncoder and pairs."""
    import transformers
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    folder = tmp_path / "ce"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        build_tiny_bert(tmp_path / "t"), num_labels=1
    )
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tmp_path / "t").save_pretrained(folder)
    queries, documents = ["a recipe for bread", "the team won", "rain tomorrow"], ["bake a cake", "snow", "sunny"]
    labels = torch.tensor([1.0, 0.0, 1.0])
    cross_encoder = CrossEncoder(str(folder), device="cpu")
    cross_encoder.eval()
    theirs = BinaryCrossEntropyLoss(cross_encoder)([queries, documents], labels)
    model.eval()
    encoded = cross_encoder.tokenizer(queries, documents, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = masked_loss(model(**encoded).logits, labels, RERANKER)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


def test_evaluation_is_accuracy_f1_and_average_precision_at_a_probability_of_a_half():
    from sklearn.metrics import accuracy_score, average_precision_score, f1_score

    logits = np.array([[2.0], [-1.0], [0.5], [-3.0], [1.0]])
    labels = np.array([1.0, 1.0, 0.0, 0.0, 1.0])
    metrics, _ = RERANKER.evaluation.evaluate(logits, labels, ["relevance"], 0.5)
    predicted = logits.reshape(-1) >= 0
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predicted))
    assert metrics["f1"] == pytest.approx(f1_score(labels, predicted))
    assert metrics["average_precision"] == pytest.approx(average_precision_score(labels, logits.reshape(-1)))


def reranked(model_dir, monkeypatch, backend: str, query: str, texts: list[str]) -> list[float]:
    """The model's own code/inference.py's TEI rerank answer, as scores in the texts' order."""
    inference, model = own_inference(model_dir, monkeypatch, backend)
    data = inference.input_fn(json.dumps({"query": query, "texts": texts}), "application/json")
    answer = outputs.shaped(data, inference.predict_fn(data, model))  # as `byoc serve` answers: TEI's rerank
    return [item["score"] for item in sorted(answer, key=lambda item: item["index"])]


@pytest.mark.integration
def test_a_reranker_trains_on_mined_negatives_and_serves_as_cross_encoder_predicts(
    job, tiny_model_dir, monkeypatch, caplog
):
    from sentence_transformers.cross_encoder import CrossEncoder

    job.hyperparameters({**QUICK, "learning_rate": "1e-3", "mine_hard_negatives": "true", "negatives_range_min": "2"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(12, seed=1, negatives=True))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("mining the reranker's hard negatives: the bundled embedding model") for m in messages)
    assert any(m.startswith("train: 64 pairs; 32 relevant and 32 irrelevant pairs") for m in messages)

    metrics = job.metrics
    assert metrics["task"] == tasks.RERANKER and metrics["train_samples"] == 64
    assert 0 <= metrics["eval_accuracy"] <= 1 and 0 < metrics["eval_average_precision"] <= 1
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["byoc_task"] == tasks.RERANKER and len(config["id2label"]) == 1
    query, texts = "how to bake a cake", ["a recipe for bread", "the team won the final", "snow storms"]
    expected = CrossEncoder(str(job.model_dir), device="cpu").predict([(query, text) for text in texts])
    for backend in ("torch", "onnxruntime"):
        served = reranked(job.model_dir, monkeypatch, backend, query, texts)
        np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_the_miner_channel_mines_a_rerankers_negatives(job, tiny_model_dir, caplog):
    job.hyperparameters({**QUICK, "mine_hard_negatives": "true", "negatives_range_min": "1"})
    job.model_channel(tiny_model_dir)
    miner = job.channel("miner")
    for path in tiny_model_dir.iterdir():
        (miner / path.name).write_bytes(path.read_bytes())
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(24))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any("hard negatives: the embedding model of the miner channel" in r.getMessage() for r in caplog.records)


@pytest.mark.integration
def test_a_reranker_on_rows_without_negatives_fails_at_start_saying_how_to_get_them(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(16))
    assert entry.train() != 0
    assert "a reranker learns from negatives: set mine_hard_negatives=true" in job.failure
    assert not (job.model_dir / "config.json").exists()


@pytest.mark.parametrize("task", [tasks.RERANKER, tasks.EMBEDDING])
def test_an_eval_splits_negatives_are_kept_for_a_reranker_where_train_has_none(tmp_path, task):
    """A reranker scores each eval negative as an irrelevant pair; an embedding model ranks every row's positive,
    so its eval negatives go where train has none (as before)."""
    from byoc.training.data import DataSpec, load_task_data

    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    write_jsonl(tmp_path / "train" / "t.jsonl", topic_rows(8))
    write_jsonl(tmp_path / "val" / "v.jsonl", topic_rows(4, seed=1, negatives=True))
    channels = {"train": tmp_path / "train", "validation": tmp_path / "val"}
    data = load_task_data(channels, DataSpec(task=task), tmp_path / "cache")
    assert ("text_negative" in data.eval.column_names) == (task == tasks.RERANKER)
    assert "text_negative" not in data.train.column_names


def test_a_two_label_model_served_as_a_reranker_is_refused_rather_than_scored_by_its_first_logit():
    with pytest.raises(BadParameter, match="one output .* this model has 2: serve it without BYOC_TASK"):
        RERANKER.head.check_rerank({"id2label": {0: "irrelevant", 1: "relevant"}, "pairs": True})
