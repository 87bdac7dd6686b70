"""byoc.encoding.encoder's reading of a rank's shards: each shard's documents come as a stream, read from the file
as they are encoded (memory holds a batch, never a shard); other ranks' shards are read past."""

from __future__ import annotations

import json

import pytest

from byoc.encoding import corpus, encoder, shards
from byoc.encoding.settings import EncodeError, EncodeSettings


def write(path, count):
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(count)))


@pytest.fixture
def reads(monkeypatch):
    """How many documents the encoder has read from the corpus files so far."""
    read = [0]
    documents = corpus.documents

    def counted(path, fields):
        for document in documents(path, fields):
            read[0] += 1
            yield document

    monkeypatch.setattr(corpus, "documents", counted)
    return read


def test_a_shard_is_read_as_it_is_encoded_and_other_ranks_shards_are_read_past(tmp_path, reads):
    write(tmp_path / "a.jsonl", 10)
    planned = shards.plan(shards.read_corpus(tmp_path, EncodeSettings()), 4)  # d0-d3, d4-d7, d8-d9
    reads[0] = 0
    mine = shards.owned(planned, 0, 2)  # the first and the third
    streams = encoder.shard_documents(mine, 4)
    shard, documents = next(streams)
    assert shard.name == "a-00000.parquet" and reads[0] == 0
    assert next(documents) == ("d0", "text 0") and reads[0] == 1  # (one document held, not the shard's four)
    assert [doc_id for doc_id, _ in documents] == ["d1", "d2", "d3"]
    shard, documents = next(streams)
    assert shard.name == "a-00002.parquet" and [doc_id for doc_id, _ in documents] == ["d8", "d9"]
    assert next(streams, None) is None and reads[0] == 10  # (the file read once)


def test_a_shard_left_part_read_is_read_past_before_the_next(tmp_path):
    write(tmp_path / "a.jsonl", 6)
    planned = shards.plan(shards.read_corpus(tmp_path, EncodeSettings()), 2)
    streams = encoder.shard_documents(planned, 2)
    next(next(streams)[1])  # (d0 only)
    assert [doc_id for doc_id, _ in next(streams)[1]] == ["d2", "d3"]


def test_a_file_that_ends_before_a_planned_shard_starts_fails_saying_it_changed(tmp_path):
    write(tmp_path / "a.jsonl", 10)
    planned = shards.plan(shards.read_corpus(tmp_path, EncodeSettings()), 4)
    write(tmp_path / "a.jsonl", 7)  # (shrunk after the job counted it)
    streams = encoder.shard_documents(planned[2:], 4)
    with pytest.raises(EncodeError, match=r"a.jsonl ended before the end of its shard a-00002.parquet \(10 doc"):
        next(streams)
