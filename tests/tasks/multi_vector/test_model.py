"""Multi-vector (ColBERT) models trained end to end: the real `byoc train` (task=colbert) on (anchor, positive,
negative) rows, from a ColBERT folder (prompts, query expansion, a skiplist) and from a plain encoder; the
folder it writes (code/ included) is a MultiVectorEncoder folder that sentence-transformers loads, `byoc serve`
answers its token vectors as `encode_query` / `encode_document` give them, on torch and on the graph the job
exported, and the job's evaluation is what the served vectors rank."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import numpy as np
import pytest

from byoc.serving.protocol import outputs
from byoc.serving.protocol.request_errors import InputError
from byoc.tasks.embedding import rank_metrics
from byoc.training import entry
from helpers import own_inference, topic_rows, write_jsonl

pytestmark = pytest.mark.integration  # a real job: not in make test-fast

# On the CPU, as the served vectors it is compared with (a GPU's TF32 could reorder near ties).
QUICK = {"max_steps": "6", "logging_steps": "2", "per_device_train_batch_size": "8", "task": "colbert", "device": "cpu"}
TEXTS = ["how to bake bread", "the team won the final, again!", ""]


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def api():
    try:
        from sentence_transformers import MultiVectorEncoder
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    except ImportError:
        pytest.skip("sentence-transformers before 6.2 has no MultiVectorEncoder: a multi-vector job needs 6.2")
    return MultiVectorEncoder, Transformer, Dense, MultiVectorMask, Normalize


def colbert_folder(tiny_model_dir: Path, target: Path) -> Path:
    import torch

    MultiVectorEncoder, Transformer, Dense, MultiVectorMask, Normalize = api()
    torch.manual_seed(1)
    encoder = Transformer(str(tiny_model_dir), document_length=24, query_expansion={"strategy": "fixed", "length": 12})
    projection = Dense(
        32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
    )
    modules = [encoder, projection, MultiVectorMask(list(string.punctuation)), Normalize("token_embeddings")]
    model = MultiVectorEncoder(modules=modules, prompts={"query": "query: ", "document": "passage: "}, device="cpu")
    model.save(str(target))
    return target


def served(model_dir: Path, monkeypatch, backend: str, body: dict) -> list:
    """The answers of the model's own code/inference.py (as SageMaker loads it) to `body`."""
    inference, model = own_inference(model_dir, monkeypatch, backend)
    assert model["backend"] == backend
    data = inference.input_fn(json.dumps(body), "application/json")
    return json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0])


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    return float((query @ document.T).max(axis=1).sum()) if len(query) and len(document) else 0.0


@pytest.mark.parametrize("source", ["colbert", "plain"])
def test_a_multi_vector_job_trains_and_its_folder_serves_as_multi_vector_encoder_encodes(
    job, tiny_model_dir, tmp_path, monkeypatch, caplog, source
):
    MultiVectorEncoder = api()[0]
    job.hyperparameters({**QUICK, "learning_rate": "1e-3", "do_predict": "true"})
    job.model_channel(colbert_folder(tiny_model_dir, tmp_path / "colbert") if source == "colbert" else tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48, negatives=True))
    # Each dev document once: equal scores rank by the evaluation's row order, which the served check below lacks
    dev = list({row["positive"]: row for row in topic_rows(24, seed=1, negatives=True)}.values())
    write_jsonl(job.channel("validation") / "dev.jsonl", dev)
    test = topic_rows(8, seed=2)
    write_jsonl(job.channel("test") / "test.jsonl", test)
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any("multi-vector model: " in r.getMessage() for r in caplog.records)
    lines = [json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(8)) and 0 <= job.metrics["test_mrr_at_10"] <= 1

    metrics = job.metrics
    assert metrics["task"] == "multi_vector" and 0 < metrics["eval_mrr_at_10"] <= 1
    folder = job.model_dir
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["model_type"] == "MultiVectorEncoder"
    reference = MultiVectorEncoder(str(folder), device="cpu")
    assert (reference.prompts.get("query") == "query: ") == (source == "colbert")
    for backend in ("torch", "onnxruntime"):
        for side, encode in (("query", reference.encode_query), ("document", reference.encode_document)):
            answers = served(folder, monkeypatch, backend, {"inputs": TEXTS, "parameters": {"prompt_name": side}})
            for got, want in zip(answers, encode(TEXTS, convert_to_numpy=True)):
                np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)

    # Each test row's MaxSim in test_predictions.jsonl is its served vectors'.
    test_queries = {"inputs": [r["anchor"] for r in test], "parameters": {"prompt_name": "query"}}
    pairs = zip(
        served(folder, monkeypatch, "torch", test_queries),
        served(folder, monkeypatch, "torch", {"inputs": [r["positive"] for r in test]}),
    )
    pairs = list(pairs)
    expected = [maxsim(np.asarray(q), np.asarray(d)) for q, d in pairs]
    expected_all = [maxsim(np.asarray(pairs[0][0]), np.asarray(d)) for _, d in pairs]  # the first query, every text
    assert [line["maxsim"] for line in lines] == pytest.approx(expected, rel=1e-4)

    # TEI's rerank body through the same code/inference.py: each text's MaxSim, best first; OpenAI's is refused.
    inference, model = own_inference(folder, monkeypatch, "torch")  # (the backend the scores above came from)
    data = inference.input_fn(
        json.dumps({"query": test[0]["anchor"], "texts": [r["positive"] for r in test]}), "application/json"
    )
    ranked = outputs.shaped(data, inference.predict_fn(data, model))
    assert [item["index"] for item in ranked] == sorted(range(8), key=lambda i: (-expected_all[i], i))[: len(ranked)]
    with pytest.raises(InputError, match="needs an embedding model"):
        inference.predict_fn(inference.input_fn(json.dumps({"input": ["a"], "model": "m"}), "application/json"), model)

    # The job's evaluation ranked each dev query's document among all of theirs by MaxSim: so do the served vectors.
    queries = served(
        folder, monkeypatch, "torch", {"inputs": [r["anchor"] for r in dev], "parameters": {"prompt_name": "query"}}
    )
    documents = served(folder, monkeypatch, "torch", {"inputs": [r["positive"] for r in dev]})
    ranks = []
    for i, query in enumerate(queries):
        scores = [maxsim(np.asarray(query), np.asarray(d)) for d in documents]
        ranks.append(1 + sum(s > scores[i] + 1e-6 for s in scores))
    assert rank_metrics(np.asarray(ranks))["mrr_at_10"] == pytest.approx(metrics["eval_mrr_at_10"], abs=1e-6)


def test_scored_pairs_are_refused_saying_what_rows_a_multi_vector_model_takes(job, tiny_model_dir):
    api()
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.csv.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 0.5}] * 8)
    assert entry.train() != 0
    assert "trains on (query, positive[, negative]) rows" in job.failure


def test_a_multi_vector_jobs_negatives_are_mined_by_the_bundled_embedding_model(job, tiny_model_dir, caplog):
    api()
    job.hyperparameters({**QUICK, "mine_hard_negatives": "true", "negatives_range_min": "2"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("mining the multi-vector's hard negatives: the bundled embedding model") for m in messages)
    assert job.metrics["task"] == "multi_vector"


def test_a_sentence_transformers_without_multi_vector_models_is_named_in_the_refusal(monkeypatch, tiny_model_dir):
    """The images' tier holds 5.1, which has no MultiVectorEncoder: the job says which version it needs."""
    import sentence_transformers

    from byoc.tasks.base import BadParameter
    from byoc.tasks.multi_vector import model

    monkeypatch.delattr(sentence_transformers, "MultiVectorEncoder", raising=False)
    with pytest.raises(BadParameter, match=f"6.2 or newer .* has {sentence_transformers.__version__}"):
        model.build(str(tiny_model_dir), False, 32, {}, {})


# --- cached in-batch negatives (mini_batch_size) ----------------------------------------------------------

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def multi_vector_gradients(tiny_model_dir: Path, mini_batch_size: int | None) -> tuple[float, dict]:
    """(loss, each weight's gradient) of one training step over 8 (query, positive, negative) rows."""
    import torch

    from byoc.tasks.multi_vector import model as multi_vector

    api()
    torch.manual_seed(0)  # (the projection a plain encoder gets is drawn)
    model = multi_vector.build(str(tiny_model_dir), False, 32, {}, NO_DROPOUT)
    if mini_batch_size:
        multi_vector.cache_negatives(model, mini_batch_size)
        assert type(model.__dict__["objective"]).__name__ == "CachedMultiVectorMultipleNegativesRankingLoss"
    model.train()
    rows = topic_rows(8, negatives=True)
    tokenizer = model.model.tokenizer
    batch = {}
    for prefix, column in (("", "anchor"), ("pair_", "positive"), ("negative_", "negative")):
        encoded = tokenizer([r[column] for r in rows], padding=True, return_tensors="pt")
        batch.update({prefix + key: value for key, value in encoded.items()})
    loss = model(**batch, labels=torch.zeros(8))["loss"]
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_the_cached_multi_vector_loss_gives_the_uncached_losss_gradients(tiny_model_dir):
    """sentence-transformers' GradCache for MaxSim: 8 rows embedded 3 at a time, replayed in the backward pass,
    end in the uncached loss's gradients."""
    import torch

    plain_loss, plain = multi_vector_gradients(tiny_model_dir, None)
    cached_loss, cached = multi_vector_gradients(tiny_model_dir, 3)
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain.keys() == cached.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(cached[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_multi_vector_job_with_cached_negatives_trains_and_evaluates(job, tiny_model_dir, caplog):
    api()
    job.hyperparameters({**QUICK, "per_device_train_batch_size": "16", "mini_batch_size": "4"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(16, seed=1, negatives=True))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("cached in-batch negatives: 4 rows a pass, gradients cached (GradCache, MaxSim)") for m in messages
    )
    assert 0 <= job.metrics["eval_mrr_at_10"] <= 1 and job.metrics["hyperparameters"]["mini_batch_size"] == 4
