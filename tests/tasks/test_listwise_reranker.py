"""byoc.tasks.listwise_reranker: a reranker trained on lists (a row's positive and negatives together) with
sentence-transformers' LambdaLoss or ListNetLoss, saved and served as the pairwise reranker is."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from byoc import tasks
from byoc.serving.protocol import outputs
from byoc.tasks.base import IGNORE_LABEL, BadParameter
from byoc.training import entry
from helpers import build_tiny_bert, own_inference, topic_rows, write_jsonl

pytestmark = pytest.mark.cpu  # losses and scores compared with sentence-transformers' on the CPU

LISTWISE = tasks.get(tasks.LISTWISE_RERANKER)
QUICK = {"max_steps": "6", "logging_steps": "2", "per_device_train_batch_size": "4", "task": "listwise_reranker"}
QUICK["device"] = "cpu"  # the served scores compared with CrossEncoder.predict's on the CPU


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


@pytest.mark.parametrize("loss", ["lambdaloss", "listnet"])
def test_the_loss_is_sentence_transformers_listwise_loss_on_the_same_lists(tmp_path, loss):
    """The job's loss (the classifier's logits of each row's pairs, a row a list, a missing negative and a filler
    row left out) equals sentence-transformers' own loss run on a CrossEncoder of the same weights and texts."""
    import transformers
    from sentence_transformers.cross_encoder import CrossEncoder, losses

    from byoc.tasks.listwise_reranker.model import ListCollator, ListwiseModel, list_encoder

    folder = tmp_path / "ce"
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
        build_tiny_bert(tmp_path / "t"), num_labels=1
    )
    classifier.save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(folder)
    batch = {
        "text": ["a recipe for bread", "the team won", "rain tomorrow"],
        "text_pair": ["bake a cake", "a great match", "a wet day"],
        "text_negative": ["snow storms", "stock prices", "guitar lessons"],
        "text_negative_2": ["the final whistle", None, "sunny spells"],
    }
    encoded = list_encoder(tokenizer, 64, False)(batch)
    assert encoded["labels"] == [[1.0, 0.0, 0.0], [1.0, 0.0, -1.0], [1.0, 0.0, 0.0]]
    rows = [{key: values[i] for key, values in encoded.items()} for i in range(3)]
    filler = {**rows[0], "labels": [IGNORE_LABEL] * 3}
    inputs = ListCollator(tokenizer, None)([*rows, filler])
    model = ListwiseModel(classifier).eval()
    model.use(loss)
    with torch.no_grad():
        ours = model(**inputs)["loss"]

    cross_encoder = CrossEncoder(str(folder), device="cpu")
    cross_encoder.eval()
    reference = losses.LambdaLoss(cross_encoder) if loss == "lambdaloss" else losses.ListNetLoss(cross_encoder)
    documents = [
        [d for d in (batch["text_pair"][i], batch["text_negative"][i], batch["text_negative_2"][i]) if d is not None]
        for i in range(3)
    ]
    labels = [torch.tensor([1.0] + [0.0] * (len(d) - 1)) for d in documents]
    with torch.no_grad():
        theirs = reference((batch["text"], documents), labels)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)


def test_evaluation_scores_every_listed_pair_and_the_positives_rank_in_its_list():
    logits = np.array([[2.0, -1.0, 0.5], [-1.0, 3.0, 0.0], [1.0, 0.2, 9.0], [0.0, 0.0, 0.0]])
    labels = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, -1.0], [1.0, 0.0, 0.0], [IGNORE_LABEL] * 3])
    metrics, _ = LISTWISE.evaluation.evaluate(logits, labels, ["relevance"], 0.5)
    pairwise, _ = tasks.get(tasks.RERANKER).evaluation.evaluate(
        np.array([[2.0], [-1.0], [0.5], [-1.0], [3.0], [1.0], [0.2], [9.0]]),
        np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]),
        ["relevance"],
        0.5,
    )
    assert {k: metrics[k] for k in pairwise} == pytest.approx(pairwise)
    assert metrics["mrr_at_10"] == pytest.approx((1 + 1 / 2 + 1 / 2) / 3)  # the padded negative is no competitor
    alike, _ = LISTWISE.evaluation.evaluate(np.zeros((2, 3)), labels[:2], ["relevance"], 0.5)
    assert alike["mrr_at_10"] == pytest.approx((1 / 3 + 1 / 2) / 2)  # a tie counts against the positive


def test_the_trainer_divides_the_lists_loss_by_the_accumulated_steps(tmp_path):
    """The model's forward takes **columns, which the Trainer would read as taking loss arguments, and then not
    divide its loss by gradient_accumulation_steps: the model says it takes none."""
    import transformers

    from byoc.tasks.listwise_reranker.model import ListwiseModel

    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
        build_tiny_bert(tmp_path / "t"), num_labels=1
    )
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    trainer = transformers.Trainer(model=ListwiseModel(classifier), args=arguments)
    assert trainer.model_accepts_loss_kwargs is False


def test_scored_pairs_are_refused_saying_what_a_list_is():
    import datasets

    table = datasets.Dataset.from_dict({"text": ["q"], "text_pair": ["d"], "label": [0.7]})
    with pytest.raises(BadParameter, match="a listwise reranker learns from lists"):
        LISTWISE.rows.pairs_of_rows(table, "train")


@pytest.mark.integration
@pytest.mark.parametrize("loss", ["lambdaloss", "listnet"])
def test_a_listwise_job_trains_on_mined_lists_and_serves_as_cross_encoder_predicts(
    job, tiny_model_dir, monkeypatch, caplog, loss
):
    from sentence_transformers.cross_encoder import CrossEncoder

    job.hyperparameters(
        {
            **QUICK,
            "learning_rate": "1e-3",
            "mine_hard_negatives": "true",
            "negatives_range_min": "1",
            "num_negatives": "3",
            "listwise_loss": loss,
            "do_predict": "true",
        }
    )
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(12, seed=1, negatives=True))
    write_jsonl(job.channel("test") / "test.jsonl", topic_rows(6, seed=2, negatives=True))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    metrics = job.metrics
    assert metrics["task"] == tasks.LISTWISE_RERANKER
    assert 0 < metrics["eval_mrr_at_10"] <= 1 and 0 <= metrics["eval_average_precision"] <= 1
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["byoc_task"] == tasks.LISTWISE_RERANKER and len(config["id2label"]) == 1
    written = (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
    predicted = [json.loads(line) for line in written]
    assert len(predicted) == 6 and all(p["labels"] == [1.0, 0.0] and len(p["scores"]) == 2 for p in predicted)

    query, texts = "how to bake a cake", ["a recipe for bread", "the team won the final", "snow storms"]
    expected = CrossEncoder(str(job.model_dir), device="cpu").predict([(query, text) for text in texts])
    for backend in ("torch", "onnxruntime"):
        inference, model = own_inference(job.model_dir, monkeypatch, backend)
        data = inference.input_fn(json.dumps({"query": query, "texts": texts}), "application/json")
        answer = outputs.shaped(data, inference.predict_fn(data, model))
        served = [item["score"] for item in sorted(answer, key=lambda item: item["index"])]
        np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_a_listwise_loss_for_another_task_is_refused_naming_the_task_that_takes_it(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "task": "reranker", "listwise_loss": "listnet", "mine_hard_negatives": "true"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(16))
    assert entry.train() != 0
    assert "listwise_loss is a setting of a listwise reranker" in job.failure
