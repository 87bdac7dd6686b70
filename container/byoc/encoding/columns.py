"""A shard's answers as Parquet columns, by their kind (byoc.tasks.kinds), never by the model's family:

- a vector: `vector`, a fixed-size list of floats (one width for the whole corpus);
- sparse terms: `indices` (int32) and `values`, the vocabulary's tokens (index order) in the file's metadata;
- token vectors: `token_vectors`, a list of fixed-size vectors (a row per token);
- several outputs (a hybrid model's): each output's columns side by side.

Every file starts with `id` (a string). pyarrow, pandas and DuckDB read the files as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from byoc.tasks.kinds import Kind

ENCODED = (Kind.VECTOR, Kind.SPARSE_TERMS, Kind.TOKEN_VECTORS)
ROW_GROUP = 2048  # documents a Parquet row group holds (the last one of a shard: what is left)


def number_type(kind: Kind, dtype: str) -> np.dtype:
    """float16 for token vectors unless float32 is asked for (how users store them); else float32 unless float16."""
    if dtype == "auto":
        return np.dtype(np.float16 if kind == Kind.TOKEN_VECTORS else np.float32)
    return np.dtype(dtype)


def table(ids: Sequence[str], answers: Sequence[Any], kinds: Mapping[str | None, Kind], dtype: str) -> pa.Table:
    """The shard's table: `kinds` maps each output's name to its kind (one entry, named None, for one output)."""
    arrays: dict[str, pa.Array] = {"id": pa.array(list(ids), pa.string())}
    for name, kind in kinds.items():
        values = [answer[name] for answer in answers] if name is not None else list(answers)
        arrays.update(_columns(kind, values, number_type(kind, dtype)))
    return pa.table(arrays)


class ShardWriter:
    """One shard's Parquet file, written beside its name a row group at a time (batches gathered to ROW_GROUP
    documents: a row group a batch of 64 slows writing and reading alike) and renamed there once whole (`close`):
    a file under a shard's name is always whole; a job stopped mid-shard leaves none (`abort`)."""

    def __init__(self, target: Path, metadata: Mapping[str, Any]) -> None:
        self.target, self.metadata = target, dict(metadata)  # (more may be added before the first batch)
        self.partial = target.with_name(f".{target.name}.partial")
        self.writer: pq.ParquetWriter | None = None
        self.pending: list[pa.Table] = []

    def write(self, data: pa.Table) -> None:
        self.pending.append(data)
        if sum(t.num_rows for t in self.pending) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        if self.writer is None:
            facts = {key.encode(): json.dumps(value).encode() for key, value in self.metadata.items()}  # (JSON each)
            schema = self.pending[0].schema.with_metadata({**(self.pending[0].schema.metadata or {}), **facts})
            self.writer = pq.ParquetWriter(self.partial, schema, compression="zstd")
        self.writer.write_table(pa.concat_tables([t.cast(self.writer.schema) for t in self.pending]))
        self.pending = []

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            os.replace(self.partial, self.target)

    def abort(self) -> None:
        self.pending = []
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.partial.unlink(missing_ok=True)


def read_metadata(path: Path) -> dict[str, Any]:
    """What a shard's file says of itself (its `byoc` metadata: how it was made), with its rows and the width of
    each vector column."""
    file = pq.ParquetFile(path)  # (opened once: its schema and its row count)
    schema = file.schema_arrow
    facts = json.loads((schema.metadata or {}).get(b"byoc", b"{}"))
    widths = {}
    for column in schema:
        kind = column.type.value_type if pa.types.is_list(column.type) else column.type
        if pa.types.is_fixed_size_list(kind):
            widths[column.name] = kind.list_size
    return {**facts, "widths": widths, "rows": file.metadata.num_rows}


def _columns(kind: Kind, values: list[Any], numbers: np.dtype) -> dict[str, pa.Array]:
    if kind == Kind.VECTOR:
        return {"vector": _vectors(np.asarray(values, dtype=numbers).reshape(len(values), -1))}
    if kind == Kind.SPARSE_TERMS:
        lengths = np.fromiter((len(terms) for terms in values), np.int64, len(values))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        indices = np.fromiter((term["index"] for terms in values for term in terms), np.int32)
        weights = np.fromiter((term["value"] for terms in values for term in terms), np.float32).astype(numbers)
        return {
            "indices": pa.ListArray.from_arrays(offsets, pa.array(indices)),
            "values": pa.ListArray.from_arrays(offsets, pa.array(weights)),
        }
    if kind == Kind.TOKEN_VECTORS:
        rows = [np.asarray(tokens, dtype=numbers) for tokens in values]
        width = next((r.shape[1] for r in rows if r.ndim == 2 and r.shape[0]), 0)
        lengths = np.array([len(r) for r in rows], np.int64)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        flat = np.concatenate([r.reshape(-1, width) for r in rows]) if rows else np.zeros((0, width), numbers)
        return {"token_vectors": pa.ListArray.from_arrays(offsets, _vectors(flat))}
    raise ValueError(f"byoc encode writes {', '.join(k.value for k in ENCODED)}, not {kind.value}")


def _vectors(matrix: np.ndarray) -> pa.FixedSizeListArray:
    width = matrix.shape[1] if matrix.ndim == 2 else 0
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(matrix).reshape(-1)), width)
