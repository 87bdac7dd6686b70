"""docs/encoding.md's Qdrant loader, run as the page shows it, on the shards `byoc encode` writes for bge-m3 (a
dense vector, sparse terms and token vectors a document): Qdrant's answers to each kind of query are the ranking
computed by hand from the shards."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

from byoc.encoding import entry
from helpers import Job, write_beir

pytestmark = pytest.mark.integration
qdrant_client = pytest.importorskip("qdrant_client", reason="the docs' vector store (the main tier's test extras)")

DOC = Path(__file__).resolve().parents[2] / "docs" / "encoding.md"


def the_pages_loader():
    block = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "def load_into_qdrant" in b)
    scope: dict = {}
    exec(compile(block, str(DOC), "exec"), scope)
    return scope["load_into_qdrant"]


@pytest.mark.cpu
def test_the_docs_loader_puts_every_kind_in_qdrant_and_it_ranks_as_the_vectors_say(
    tiny_model_dir, tmp_path, monkeypatch
):
    from tasks import test_hybrid

    job = Job(tmp_path / "opt-ml").resources().hyperparameters({"output": "dense,sparse,colbert", "dtype": "float32"})
    job.model_channel(test_hybrid.build(tiny_model_dir, tmp_path / "m3"))
    write_beir(job.channel("corpus"))
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(job.root))
    assert entry.encode() == 0, job.failure
    shards = job.model_dir / "shards"
    client = qdrant_client.QdrantClient(":memory:")
    rows = ds.dataset(shards, format="parquet").to_table().to_pylist()
    assert the_pages_loader()(str(shards), client, "corpus") == len(rows)

    query = rows[0]
    dense = {r["id"]: float(np.dot(query["vector"], r["vector"])) for r in rows}  # (unit vectors: cosine)
    terms = dict(zip(query["indices"], query["values"]))
    sparse = {r["id"]: sum(terms.get(i, 0.0) * v for i, v in zip(r["indices"], r["values"])) for r in rows}
    q = np.asarray(query["token_vectors"])
    maxsim = {r["id"]: float((q @ np.asarray(r["token_vectors"]).T).max(axis=1).sum()) for r in rows}
    models = qdrant_client.models
    asked = {
        "dense": (query["vector"], dense),
        "sparse": (models.SparseVector(indices=query["indices"], values=query["values"]), sparse),
        "colbert": (query["token_vectors"], maxsim),
    }
    for using, (vector, by_hand) in asked.items():
        found = client.query_points("corpus", query=vector, using=using, limit=3).points
        expected = sorted(by_hand, key=lambda i: -by_hand[i])[:3]
        assert [p.payload["doc_id"] for p in found] == expected, using
        assert [p.score for p in found] == pytest.approx([by_hand[i] for i in expected], rel=1e-4), using
