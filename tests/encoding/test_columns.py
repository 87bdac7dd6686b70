"""byoc.encoding.columns: each kind of answer as Parquet columns, and a shard file that is whole or absent."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from byoc.encoding import columns
from byoc.tasks.kinds import Kind


def test_each_kind_has_its_columns_and_numbers():
    vectors = columns.table(["a", "b"], [[1.0, 2.0], [3.0, 4.0]], {None: Kind.VECTOR}, "auto")
    assert vectors.column_names == ["id", "vector"] and str(vectors.schema.field("vector").type) == (
        "fixed_size_list<item: float>[2]"
    )
    terms = [[{"index": 3, "value": 0.5}, {"index": 9, "value": 1.25}], []]
    sparse = columns.table(["a", "b"], terms, {None: Kind.SPARSE_TERMS}, "auto")
    assert sparse["indices"].to_pylist() == [[3, 9], []] and sparse["values"].to_pylist() == [[0.5, 1.25], []]
    tokens = [[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], [[2.0, 2.0]]]
    multi = columns.table(["a", "b"], tokens, {None: Kind.TOKEN_VECTORS}, "auto")
    assert str(multi.schema.field("token_vectors").type) == "list<item: fixed_size_list<item: halffloat>[2]>"
    assert [np.stack(row).tolist() for row in multi["token_vectors"].to_numpy(zero_copy_only=False)] == tokens
    as32 = columns.table(["a", "b"], tokens, {None: Kind.TOKEN_VECTORS}, "float32")
    assert "item: float>[2]" in str(as32.schema.field("token_vectors").type)
    both = [{"dense": [1.0, 0.0], "sparse": terms[0]}, {"dense": [0.0, 1.0], "sparse": []}]
    hybrid = columns.table(["a", "b"], both, {"dense": Kind.VECTOR, "sparse": Kind.SPARSE_TERMS}, "float16")
    assert hybrid.column_names == ["id", "vector", "indices", "values"]
    assert str(hybrid.schema.field("values").type) == "list<item: halffloat>"
    with pytest.raises(ValueError, match="byoc encode writes vector, sparse_terms, token_vectors, not labels"):
        columns.table(["a"], [{"label": "x"}], {None: Kind.LABELS}, "auto")


def test_a_shard_file_is_there_whole_or_not_at_all(tmp_path):
    target = tmp_path / "c-00000.parquet"
    writer = columns.ShardWriter(target, {"byoc": {"task": "embedding"}})
    writer.write(columns.table(["a"], [[1.0, 2.0]], {None: Kind.VECTOR}, "auto"))
    assert not target.exists()  # (the batches so far are beside it, under a hidden name)
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    writer = columns.ShardWriter(target, {"byoc": {"task": "embedding"}})
    for doc in ("a", "b"):
        writer.write(columns.table([doc], [[1.0, 2.0]], {None: Kind.VECTOR}, "auto"))
    writer.close()
    writer.abort()  # (after close: nothing to drop)
    assert pq.read_table(target)["id"].to_pylist() == ["a", "b"]
    assert columns.read_metadata(target) == {"task": "embedding", "widths": {"vector": 2}, "rows": 2}

    big = tmp_path / "c-00001.parquet"
    writer = columns.ShardWriter(big, {})
    for start in range(0, 5000, 64):  # (batches of 64 gathered into row groups of ROW_GROUP documents)
        count = min(64, 5000 - start)
        writer.write(
            columns.table([str(start + n) for n in range(count)], [[1.0]] * count, {None: Kind.VECTOR}, "auto")
        )
    writer.close()
    groups = pq.ParquetFile(big).metadata
    assert [groups.row_group(g).num_rows for g in range(groups.num_row_groups)] == [2048, 2048, 904]
