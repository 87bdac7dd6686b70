"""byoc.training.corpus_evaluation: a retrieval model evaluated on a BEIR set after training, by
sentence-transformers' own evaluators, with BM25 beside it."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from byoc import compat, tasks
from byoc.training import corpus_evaluation, entry
from byoc.training.corpus_evaluation import REPORTED, bm25_scores, check_sets, model_scores
from byoc.training.data.beir import read_set
from byoc.training.metrics import metric_definitions
from helpers import build_tiny_mlm, topic_rows, write_beir, write_jsonl

# The job evaluates where it trains: on the CPU, as the evaluator run here on the folder it wrote (a GPU's TF32
# could reorder near ties).
QUICK = {"max_steps": "4", "logging_steps": "2", "per_device_train_batch_size": "8", "device": "cpu"}


def test_bm25_ranks_by_shared_terms_and_the_evaluator_scores_its_hits(tmp_path):
    """Each query ("something about <topic>") shares one term with one document (the topic's titled one): that
    document first, the topic's two others not retrieved at all (they share no term with it)."""
    scores = bm25_scores(read_set(write_beir(tmp_path / "test"), "test", "test"))
    assert scores["mrr_at_10"] == scores["accuracy_at_1"] == 1.0
    assert scores["recall_at_10"] == scores["recall_at_100"] == pytest.approx(1 / 3)
    ideal = sum(1 / math.log2(rank + 2) for rank in range(3))
    assert scores["ndcg_at_10"] == pytest.approx(1 / ideal)
    assert scores["map_at_100"] == pytest.approx(1 / 3)


def test_a_set_for_a_model_that_ranks_nothing_is_refused_naming_the_task(tmp_path):
    found = {"test": read_set(write_beir(tmp_path / "test"), "test", "test")}
    check_sets(found, tasks.EMBEDDING)
    check_sets({}, tasks.DEFAULT)
    with pytest.raises(ValueError, match=r"test channel holds a BEIR retrieval set .* trains a single-label"):
        check_sets(found, tasks.DEFAULT)


def test_on_the_xla_path_the_model_encodes_on_the_host_then_goes_back(tmp_path, monkeypatch):
    class Retriever:
        def __init__(self) -> None:
            self.device, self.moves = torch.device("xla"), []

        def to(self, device):
            self.moves.append(str(device))
            self.device = torch.device(device)
            return self

    class Scoring:
        primary_metric = "corpus_cosine_ndcg@10"

        def __call__(self, retriever):
            assert retriever.device.type == "cpu"
            return {f"corpus_cosine_{key}": 0.5 for key in REPORTED}

    monkeypatch.setattr(corpus_evaluation, "evaluator", lambda *args: Scoring())
    retriever = Retriever()
    found = read_set(write_beir(tmp_path / "test"), "test", "test")
    assert model_scores(found, None, retriever, 8) == dict.fromkeys(REPORTED.values(), 0.5)
    assert retriever.moves == ["cpu", "xla"]


def evaluated(kind: str, folder, found) -> dict[str, float]:
    """sentence-transformers' own figures for the folder the job wrote, loaded afresh."""
    if kind == "maxsim":
        from sentence_transformers import MultiVectorEncoder as model_class  # (6.2 on: the test skips before)
    else:
        model_class = compat.sparse_encoder_api()[0] if kind == "sparse" else compat.sentence_transformers_api()[0]
    task = tasks.get({"sparse": "sparse_embedding", "maxsim": "multi_vector"}.get(kind, "embedding"))
    scoring = corpus_evaluation.evaluator(found, task.evaluation.corpus_evaluator())  # (the task's own evaluator)
    results = scoring(model_class(str(folder), device="cpu"))
    prefix = scoring.primary_metric.removesuffix("ndcg@10")
    return {name: results[prefix + key] for key, name in REPORTED.items()}


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["dense", "sparse", "maxsim"])
def test_a_job_reports_the_written_models_figures_on_the_test_set_and_bm25s(
    job, tiny_model_dir, tmp_path, kind, caplog
):
    if kind == "maxsim":  # a multi-vector model's
        pytest.importorskip("sentence_transformers.multi_vector_encoder", reason="multi-vector models: 6.2 on")
    hyperparameters = {
        **QUICK,
        "task": {"sparse": "sparse_embedding", "maxsim": "multi_vector"}.get(kind, "embedding"),
    }
    job.hyperparameters(hyperparameters)
    job.model_channel(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm") if kind == "sparse" else tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    test_set = write_beir(job.channel("test") / "topics")
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure

    metrics = job.metrics
    logged = {  # what a tuning job's metric definitions read of the log
        d["Name"]: float(match.group(1))
        for d in metric_definitions(hyperparameters["task"])
        for record in caplog.records
        if (match := re.search(d["Regex"], record.getMessage()))
    }
    assert logged["test:corpus_ndcg_at_10"] == pytest.approx(metrics["test_corpus_ndcg_at_10"], abs=1e-5)
    assert logged["test:bm25_ndcg_at_10"] == pytest.approx(metrics["test_bm25_ndcg_at_10"], abs=1e-5)
    found = read_set(test_set, "test", "test")
    expected = evaluated(kind, job.model_dir, found)
    for name, value in expected.items():
        assert metrics[f"test_corpus_{name}"] == pytest.approx(value, abs=1e-6), name
    assert {key.removeprefix("test_bm25_"): value for key, value in metrics.items() if "_bm25_" in key} == (
        pytest.approx(bm25_scores(found))
    )
    assert not any(key.startswith("test_") and "corpus" not in key and "bm25" not in key for key in metrics)


@pytest.mark.integration
def test_a_classifier_job_with_a_retrieval_set_fails_before_training(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", [{"text": f"text {i}", "label": i % 2} for i in range(16)])
    write_beir(job.channel("test"))
    assert entry.train() != 0
    assert "holds a BEIR retrieval set" in job.failure and "task=embedding" in job.failure
    assert not (job.model_dir / "config.json").exists()


@pytest.mark.integration
def test_a_corpus_bm25_cannot_index_keeps_the_models_figures_and_leaves_the_baseline_out(job, tiny_model_dir, caplog):
    """A corpus of stopwords only: BM25's index failed ("max() arg is an empty sequence") after training, and the job
    failed with it, dropping the model's own figures. The baseline is left out with a warning; the job succeeds."""
    job.hyperparameters({**QUICK, "task": "embedding"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    test_set = write_beir(job.channel("test") / "topics")
    stopwords = ["the a of", "and to in", "it is", "an on at"]
    corpus = [json.loads(line) for line in (test_set / "corpus.jsonl").read_text().splitlines()]
    write_jsonl(
        test_set / "corpus.jsonl",
        [{"_id": row["_id"], "text": stopwords[i % len(stopwords)]} for i, row in enumerate(corpus)],
    )
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert 0 <= job.metrics["test_corpus_ndcg_at_10"] <= 1
    assert not any("bm25" in key for key in job.metrics)
    assert "BM25 cannot index its corpus" in caplog.text and "test_bm25_*) is left out" in caplog.text


@pytest.mark.integration
def test_a_set_file_that_is_not_utf8_fails_the_job_naming_the_file_line_and_byte(job, tiny_model_dir):
    """A byte of Latin-1 in corpus.jsonl ended in "unexpected error: UnicodeDecodeError", naming no file."""
    job.hyperparameters({**QUICK, "task": "embedding"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    test_set = write_beir(job.channel("test") / "topics")
    lines = (test_set / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"text": "', b'"text": "caf\xe9 ')
    (test_set / "corpus.jsonl").write_bytes(b"".join(lines))
    assert entry.train() != 0
    assert "corpus.jsonl in the test channel, line 3: byte 0xe9" in job.failure and "UTF-8" in job.failure, job.failure
    assert "unexpected" not in job.failure


@pytest.mark.integration
def test_a_reranker_is_evaluated_reordering_the_embedding_models_top_100(job, tiny_model_dir, caplog):
    """The bundled embedding model retrieves (it mined the negatives too); the reranker's figures are its order of
    that model's top 100 as CrossEncoder.predict scores it; the embedding model's own are reported beside."""
    from sentence_transformers.cross_encoder import CrossEncoder

    from byoc.training.model import bundled_model_dir

    job.hyperparameters({**QUICK, "task": "reranker", "mine_hard_negatives": "true", "negatives_range_min": "2"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    found = read_set(write_beir(job.channel("test")), "test", "test")
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any(
        r.getMessage().startswith("retrieving the retrieval set's top 100 for the reranker: the bundled embedding")
        for r in caplog.records
    )
    metrics = job.metrics
    assert {key: metrics[f"test_retriever_{key}"] for key in REPORTED.values()} == pytest.approx(
        evaluated("dense", bundled_model_dir(), found), abs=1e-6
    )
    scoring = corpus_evaluation.evaluator(found)
    cross_encoder = CrossEncoder(str(job.model_dir), device="cpu")  # every document is in the top 100 of 12
    hits = []
    for query in scoring.queries_ids:
        scores = cross_encoder.predict([(found.queries[query], found.corpus[doc]) for doc in scoring.corpus_ids])
        hits.append([{"corpus_id": doc, "score": float(s)} for doc, s in zip(scoring.corpus_ids, scores)])
    expected = corpus_evaluation._flat(scoring.compute_metrics(hits))
    assert {key: metrics[f"test_corpus_{key}"] for key in REPORTED.values()} == pytest.approx(expected, abs=1e-6)
    assert "test_bm25_ndcg_at_10" in metrics


@pytest.mark.integration
def test_a_generative_reranker_is_evaluated_reordering_the_top_100_by_its_template(job, tmp_path):
    """A generative reranker's pairs are rendered by its chat template for the reordering, as served: its figures
    are the order its own yes/no logits give the embedding model's top 100."""
    import generative_rerankers

    folder = generative_rerankers.build("qwen3-reranker", tmp_path / "reranker")
    job.hyperparameters({**QUICK, "task": "generative_reranker", "max_length": "512"})  # (no pair cut: see below)
    job.model_channel(folder)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(16, negatives=True))
    found = read_set(write_beir(job.channel("test")), "test", "test")
    assert entry.train() == 0, job.failure
    scoring = corpus_evaluation.evaluator(found)
    hits = []
    for query in scoring.queries_ids:  # (the images' sentence-transformers predates LogitScore: transformers' score)
        pairs = [(found.queries[query], found.corpus[doc]) for doc in scoring.corpus_ids]
        scores = generative_rerankers.reference_logits(job.model_dir, pairs)
        hits.append([{"corpus_id": doc, "score": float(s)} for doc, s in zip(scoring.corpus_ids, scores)])
    expected = corpus_evaluation._flat(scoring.compute_metrics(hits))
    assert {key: job.metrics[f"test_corpus_{key}"] for key in REPORTED.values()} == pytest.approx(expected, abs=1e-6)
