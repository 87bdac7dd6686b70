"""byoc.model_folder: the input-length rule training and serving share (training records it in the
model folder, serving truncates there: serving/test_under_fire.py's 5.8 MB text shows the effect)."""

from __future__ import annotations

import json

import pytest

from byoc import model_folder
from byoc.model_folder import DEFAULT_MAX_LENGTH, max_length


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ((256, 512), 256),  # the tokenizer's model_max_length under the model's positions
        ((512, 128), 128),
        ((1e30, 512), 512),  # a tokenizer that does not know its limit reports 1e30
        ((None, 384), 384),
        ((True, 64), 64),  # a bool is no limit, though Python counts it an int
        ((0, -1, "512"), DEFAULT_MAX_LENGTH),  # nothing usable: the default
        ((), DEFAULT_MAX_LENGTH),
        ((300.0,), 300),
    ],
)
def test_the_smallest_known_limit_wins(limits, expected):
    assert max_length(*limits) == expected


def test_a_router_folders_transformer_is_its_document_routes(tmp_path):
    """An inference-free sparse model: the transformer byoc runs is in the document route's first folder that
    holds a config.json; any other folder is its own."""
    (tmp_path / "document_0_MLMTransformer").mkdir()
    (tmp_path / "document_0_MLMTransformer" / "config.json").write_text("{}")
    structure = {"query": ["query_0_SparseStaticEmbedding"], "document": ["document_0_MLMTransformer", "x"]}
    (tmp_path / "router_config.json").write_text(json.dumps({"structure": structure}))
    assert model_folder.router_routes(tmp_path) == structure
    assert model_folder.weights_dir(tmp_path) == tmp_path / "document_0_MLMTransformer"
    (tmp_path / "config.json").write_text("{}")  # a transformer at the top: no Router folder
    assert model_folder.router_routes(tmp_path) == {} and model_folder.weights_dir(tmp_path) == tmp_path


@pytest.mark.parametrize(
    "config, tokens",
    [
        ({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
        ({"model_type": "xlm-roberta", "max_position_embeddings": 8194, "pad_token_id": 1}, 8192),  # bge-m3's
        ({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
        ({"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0}, 512),
        ({"model_type": "modernbert", "max_position_embeddings": 8192, "pad_token_id": 50283}, 8192),
        ({"model_type": "roberta"}, None),
    ],
)
def test_the_positions_a_model_holds_leave_out_robertas_padding_offset(config, tokens):
    """RoBERTa's family counts positions past the padding index: 514 embeddings hold 512 tokens (a Hub folder
    whose tokenizer states no length crashed on a long text at 513)."""
    assert model_folder.positions(config) == tokens
    from transformers import AutoConfig

    if "max_position_embeddings" in config:  # a transformers config reads the same
        assert model_folder.positions(AutoConfig.for_model(**config)) == tokens
