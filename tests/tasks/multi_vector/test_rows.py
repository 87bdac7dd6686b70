"""byoc.tasks.multi_vector.rows: training rows tokenized as queries and documents, the batches, and the MaxSim
evaluation over packed token vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from byoc.tasks.multi_vector.rows import PLAIN, RowCollator, folder_settings, maxsim_metrics, own_scores, row_encoder


def packed(queries: list[np.ndarray], documents: list[np.ndarray], width: int = 4) -> np.ndarray:
    """Rows as the training model packs them: the width, then each side's tokens (a vector and a mask component)."""
    rows = []
    for q, d in zip(queries, documents):
        sides = []
        for tokens in (q, d):
            side = np.zeros((width, tokens.shape[1] + 1), dtype=np.float32)
            side[: len(tokens), :-1], side[: len(tokens), -1] = tokens, 1.0
            sides.append(side.reshape(-1))
        rows.append(np.concatenate([[width], *sides]))
    return np.asarray(rows, dtype=np.float32)


def test_each_query_ranks_every_rows_document_by_maxsim_ties_by_row():
    q = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([[0.0, 1.0]])]
    d = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[0.0, 1.0]])]
    logits, labels = packed(q, d), np.full(3, np.nan)
    # query 0: its document 1.0 first; query 1: docs score 1, 1, 1 (ties: row order, its own second);
    # query 2: docs 0, 1, 1: its own ties row 1, which ranks first
    metrics = maxsim_metrics(logits, labels)
    assert metrics["mrr_at_10"] == pytest.approx((1 + 1 / 2 + 1 / 2) / 3)
    assert metrics["recall_at_1"] == pytest.approx(1 / 3)
    assert own_scores(logits, labels) == pytest.approx([1.0, 1.0, 1.0])


def test_the_anchor_is_a_query_and_the_others_documents_with_the_expansion_positions_batched(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert folder_settings(tokenizer) is PLAIN  # a plain encoder: sentence-transformers' default modules
    encode = row_encoder(tokenizer, 16)
    rows = encode({"text": ["a b", "c"], "text_pair": ["d e f", "g"], "label": [float("nan")] * 2})
    assert rows["length"] == [5, 3] and rows["query_expansion"] == [[0] * 4, [0] * 3]
    features = [{key: values[i] for key, values in rows.items()} for i in range(2)]
    batch = RowCollator(tokenizer, None)(features)
    assert batch["query_expansion"].shape == batch["input_ids"].shape == (2, 4)
    assert batch["pair_input_ids"].shape == (2, 5) and torch.isnan(batch["labels"]).all()


def test_rows_tokenized_for_another_task_in_the_same_cache_are_tokenized_again(tiny_model_dir, tmp_path):
    """The tokenized-data cache (keyed by the rows and the tokenizer) once handed a multi-vector job the rows an
    embedding job had tokenized: no query expansion column, the documents without their prompt."""
    import dataclasses

    import datasets

    from byoc import tasks
    from byoc.training.data import TaskData
    from byoc.training.hyperparameters import parse_hyperparameters
    from byoc.training.tokenization import tokenize_splits

    train = datasets.Dataset.from_dict({"text": ["a b", "c"], "text_pair": ["d", "e"], "label": [float("nan")] * 2})
    data = TaskData(train=train, eval=None, test=None, label_names=[], pretokenized=False, task=tasks.EMBEDDING)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = parse_hyperparameters({"max_length": "16"})
    assert "query_expansion" not in tokenize_splits(data, tokenizer, args, tmp_path)["train"].column_names
    multi_vector = dataclasses.replace(data, task=tasks.MULTI_VECTOR)
    assert "query_expansion" in tokenize_splits(multi_vector, tokenizer, args, tmp_path)["train"].column_names
