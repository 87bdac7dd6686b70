"""byoc.tasks.sparse_embedding.folder: a sparse folder's modules and an inference-free model's query table, read
without torch (the serving image's)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from byoc import sentence_folder
from byoc.tasks.sparse_embedding.folder import modules, query_table, read_vector


def write_safetensors(path, name: str, values: np.ndarray, dtype: str) -> None:
    raw = values.astype({"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()
    header = json.dumps({name: {"dtype": dtype, "shape": [len(values)], "data_offsets": [0, len(raw)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw)


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_a_vector_is_read_from_safetensors_bytes_as_float32(tmp_path, dtype):
    values = np.array([0.0, 1.5, -2.25, 3.0])
    write_safetensors(tmp_path / "model.safetensors", "weight", values, dtype)
    got = read_vector(tmp_path / "model.safetensors", "weight")
    assert got.dtype == np.float32 and got.tolist() == values.tolist()
    with pytest.raises(sentence_folder.FolderError, match="no readable 1-D 'bias'"):
        read_vector(tmp_path / "model.safetensors", "bias")


def test_a_plain_sparse_folder_has_one_route_and_no_query_table(tmp_path):
    listed = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": "sentence_transformers.x.SpladePooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(listed))
    (tmp_path / "config.json").write_text("{}")
    assert modules(tmp_path) == {"": [("", "MLMTransformer"), ("1_SpladePooling", "SpladePooling")]}
    assert query_table(tmp_path) is None
