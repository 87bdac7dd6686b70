"""byoc.encoding.shards: every document in exactly one shard, every shard owned by exactly one rank of one host;
ids given twice refused by name."""

from __future__ import annotations

import json

import pytest

from byoc.encoding import corpus, shards
from byoc.encoding.settings import EncodeError, EncodeSettings


def write(path, ids):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": f"text {i}"}) + "\n" for i in ids))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_each_shard_is_owned_by_exactly_one_rank(tmp_path, world):
    write(tmp_path / "a.jsonl", range(25))
    write(tmp_path / "sub" / "b.jsonl", range(100, 103))
    files = shards.read_corpus(tmp_path, EncodeSettings())
    every = shards.plan(files, 10)
    assert [(s.name, s.documents) for s in every] == [
        ("a-00000.parquet", 10),
        ("a-00001.parquet", 10),
        ("a-00002.parquet", 5),
        ("sub__b-00000.parquet", 3),
    ]
    owned = [s for rank in range(world) for s in shards.owned(every, rank, world)]
    assert sorted(s.name for s in owned) == sorted(s.name for s in every)


def test_ranks_span_hosts_unless_the_channel_is_sharded_by_key():
    assert shards.Ranks.of(2, ["algo-1", "algo-2"], "algo-2", sharded=False) == shards.Ranks(2, 2, 4)
    assert shards.Ranks.of(2, ["algo-1", "algo-2"], "algo-2", sharded=True) == shards.Ranks(2, 0, 2)
    assert shards.Ranks.of(3, ["algo-1"], "algo-1", sharded=False) == shards.Ranks(3, 0, 3)


def test_ids_given_twice_are_refused_naming_them_and_their_files(tmp_path):
    write(tmp_path / "a.jsonl", ["x", "y", "z"])
    write(tmp_path / "b.jsonl", ["q", "y"])
    with pytest.raises(
        EncodeError, match=r"1 document id\(s\) appear more than once in the corpus: 'y' \(a.jsonl, b.jsonl\)"
    ):
        shards.read_corpus(tmp_path, EncodeSettings())


def test_files_whose_shards_would_share_a_name_are_refused_and_empty_files_skipped(tmp_path):
    write(tmp_path / "part.jsonl", ["a"])
    (tmp_path / "part.csv").write_text("id,text\nb,x\n")
    with pytest.raises(EncodeError, match=r"part.csv and part.jsonl would write shards of one name \(part-NNNNN"):
        shards.read_corpus(tmp_path, EncodeSettings())
    (tmp_path / "part.csv").unlink()
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "header.csv").write_text("id,text\n")
    assert [f.source for f in shards.read_corpus(tmp_path, EncodeSettings())] == ["part.jsonl"]


def test_ids_that_only_share_a_hash_are_not_duplicates(tmp_path, monkeypatch):
    write(tmp_path / "a.jsonl", ["x", "y"])
    monkeypatch.setattr(corpus, "id_hash", lambda doc_id: 7)  # (two ids, one 64-bit hash)
    assert [f.documents for f in shards.read_corpus(tmp_path, EncodeSettings())] == [2]
