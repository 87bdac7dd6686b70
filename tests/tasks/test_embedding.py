"""byoc.tasks.embedding: the answer's normalization, Matryoshka dimensions and prompts; each pooling mode
against sentence-transformers' own Pooling module."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from byoc import tasks
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
