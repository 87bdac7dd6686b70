"""byoc.tasks.embedding: the answer's normalization, Matryoshka dimensions and prompts; each pooling mode
against sentence-transformers' own Pooling module."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from byoc import tasks
from byoc.tasks import IGNORE_LABEL, embedding
from byoc.tasks.embedding import pool

EMBEDDING = tasks.get(tasks.EMBEDDING)


def test_vectors_are_unit_length_unless_asked_and_dimensions_cut_then_normalize():
    rows = [np.array([3.0, 4.0, 12.0], dtype=np.float32), np.array([0.0, 0.0, 0.0], dtype=np.float32)]
    unit = EMBEDDING.answer(rows, {}, {}, {})
    assert unit[0] == pytest.approx([3 / 13, 4 / 13, 12 / 13]) and unit[1] == [0.0, 0.0, 0.0]  # zero stays zero
    assert EMBEDDING.answer(rows, {}, {"normalize": False}, {})[0] == [3.0, 4.0, 12.0]
    assert EMBEDDING.answer(rows, {}, {"dimensions": 2}, {})[0] == pytest.approx([0.6, 0.8])
    assert EMBEDDING.answer(rows, {}, {"dimensions": 2, "normalize": False}, {})[0] == [3.0, 4.0]
    with pytest.raises(tasks.BadParameter, match='"dimensions" is 4, more than the model\'s 3'):
        EMBEDDING.answer(rows, {}, {"dimensions": 4}, {})


def test_prompts_come_before_the_text():
    model = {"prompts": {"query": "query: ", "doc": "passage: "}, "default_prompt_name": "query"}
    assert EMBEDDING.prepare(["a", "b"], {}, model) == ["query: a", "query: b"]
    assert EMBEDDING.prepare(["a"], {"prompt_name": "doc"}, model) == ["passage: a"]
    assert EMBEDDING.prepare(["a"], {}, {}) == ["a"]
    with pytest.raises(tasks.BadParameter, match="not one of the model's prompts \\(doc, query\\)"):
        EMBEDDING.prepare(["a"], {"prompt_name": "nope"}, model)
    with pytest.raises(tasks.BadParameter, match="not pairs"):
        EMBEDDING.prepare([("a", "b")], {}, {})


@pytest.mark.parametrize("mode", ["cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken"])
def test_each_pooling_is_sentence_transformers(mode):
    try:  # sentence-transformers 6 (transformers 5); 5.x keeps it in .models (transformers 4.55)
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:
        from sentence_transformers.models import Pooling

    torch.manual_seed(0)
    states = torch.randn(3, 7, 8)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    named = {"mean_sqrt_len": "mean_sqrt_len_tokens"}.get(mode, mode)  # sentence-transformers' name for it
    theirs = Pooling(8, pooling_mode=named)({"token_embeddings": states, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(pool(states, mask, mode), theirs)


# --- trained: the evaluation's metrics --------------------------------------------------------------------


def _unit(rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_retrieval_metrics_rank_each_anchors_own_positive_among_every_rows():
    queries = _unit([[1, 0], [0, 1], [1, 1]])
    # Query 0's own document is the best match; query 1's ranks 3rd; query 2's ties with another (ranks 1st).
    documents = _unit([[1, 0.1], [1, -0.2], [1, 1]])
    metrics = embedding.retrieval_metrics(queries, documents, block=2)  # blocks: the same figures
    ranks = np.array([1, 3, 1])
    assert metrics["recall_at_1"] == pytest.approx(2 / 3)
    assert metrics["recall_at_10"] == 1.0
    assert metrics["mrr_at_10"] == pytest.approx(np.mean(1 / ranks))
    assert metrics["ndcg_at_10"] == pytest.approx(np.mean(1 / np.log2(ranks + 1)))


def test_retrieval_metrics_agree_with_a_plain_ranking_by_sentence_transformers_cosine():
    rng = np.random.default_rng(0)
    queries, documents = _unit(rng.normal(size=(40, 8))), _unit(rng.normal(size=(40, 8)))
    ours = embedding.retrieval_metrics(queries, documents, block=7)
    from sentence_transformers.util import cos_sim

    scores = cos_sim(torch.tensor(queries), torch.tensor(documents)).numpy()
    ranks = np.array([1 + int((row > row[i]).sum()) for i, row in enumerate(scores)])
    assert ours["mrr_at_10"] == pytest.approx(np.where(ranks <= 10, 1 / ranks, 0).mean(), abs=1e-6)
    assert ours["recall_at_10"] == pytest.approx((ranks <= 10).mean())


def test_an_evaluation_scores_pairs_by_spearman_of_cosine_or_rows_by_retrieval():
    task = embedding.Embedding()
    angles = np.array([0.1, 0.8, 2.0, 0.4])  # between each pair's vectors: cosines in the scores' order
    first, second = _unit([[1, 0]] * 4), _unit(np.stack([np.cos(angles), np.sin(angles)], axis=1))
    logits = np.concatenate([first, second], axis=1)
    scores = np.array([5.0, 3.0, 0.5, 4.0], dtype=np.float32)
    metrics, _ = task.evaluate(logits, scores, ["score"], 0.0)
    assert metrics["spearman_cosine"] == pytest.approx(1.0)  # cosines in the scores' order
    # A fixed-shape batch's filler row (IGNORE_LABEL) is dropped; rows without scores (NaN) are retrieval.
    filled = np.concatenate([logits, np.zeros((1, 4), dtype=np.float32)])
    unscored = np.array([np.nan] * 4 + [IGNORE_LABEL], dtype=np.float32)
    metrics, _ = task.evaluate(filled, unscored, [], 0.0)
    assert set(metrics) == {"mrr_at_10", "ndcg_at_10", "recall_at_1", "recall_at_10"}
    lines = task.predictions(logits, scores, ["score"], np.asarray(0.5))
    assert [line["label"] for line in lines] == [5.0, 3.0, 0.5, 4.0]
    assert lines[0]["cosine"] == pytest.approx(float(first[0] @ second[0]), abs=1e-6)
