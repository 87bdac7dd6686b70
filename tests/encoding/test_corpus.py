"""byoc.encoding.corpus: the corpus channel's files and fields, BEIR's title joined as its loaders join it, and
errors that name the file and row."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from byoc.encoding import corpus
from byoc.encoding.settings import EncodeError, EncodeSettings


def lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read(path, **settings):
    return list(corpus.documents(path, corpus.fields_of(path, EncodeSettings(**settings))))


def test_a_beir_corpus_joins_title_and_text_as_beirs_loaders_do(tmp_path):
    path = lines(
        tmp_path / "corpus.jsonl",
        [
            {"_id": "a", "title": "Paris", "text": "is a city", "metadata": {}},
            {"_id": 7, "title": "", "text": " spaced "},
            {"_id": "c", "title": "Only a title", "text": ""},
        ],
    )
    assert corpus.fields_of(path, EncodeSettings()) == corpus.Fields("_id", "text", "title")
    assert read(path) == [("a", "Paris is a city"), ("7", "spaced"), ("c", "Only a title")]


def test_csv_tsv_and_parquet_read_alike_with_fields_named_or_found(tmp_path):
    (tmp_path / "a.csv").write_text('id,contents\n1,"one, with a comma"\n2,\n')
    (tmp_path / "b.tsv").write_text("pid\tpassage\tx\np1\tfirst\t0\n")
    pq.write_table(pa.table({"key": ["k1", "k2"], "body": ["x", "y"]}), tmp_path / "c.parquet")
    assert read(tmp_path / "a.csv") == [("1", "one, with a comma"), ("2", "")]  # an empty text is kept
    assert read(tmp_path / "b.tsv") == [("p1", "first")]
    assert read(tmp_path / "c.parquet", id_field="key") == [("k1", "x"), ("k2", "y")]
    (tmp_path / ".hidden.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert [p.name for p in corpus.corpus_files(tmp_path)] == ["a.csv", "b.tsv", "c.parquet"]


def test_a_long_csv_document_is_read_and_the_process_s_csv_limit_put_back(tmp_path):
    """The csv module's field limit is the process's: raised for a long document, it is put back when the file
    is read (left raised, it let the server's CSV bodies past the limit they are refused at)."""
    import csv

    before = csv.field_size_limit()
    (tmp_path / "long.csv").write_text("id,text\n1," + "x" * (before + 10) + "\n")
    assert read(tmp_path / "long.csv") == [("1", "x" * (before + 10))]
    assert csv.field_size_limit() == before


def test_what_cannot_be_encoded_is_named_with_its_file_and_row(tmp_path):
    missing_id = lines(tmp_path / "m.jsonl", [{"id": "a", "text": "x"}, {"text": "y"}])
    with pytest.raises(EncodeError, match=r"m.jsonl line 2: the document has no id \(field 'id'\)"):
        read(missing_id)
    null_text = lines(tmp_path / "n.jsonl", [{"id": "a", "text": None}])
    with pytest.raises(EncodeError, match=r"n.jsonl line 1 \(id 'a'\): field 'text' is missing"):
        read(null_text)
    with pytest.raises(EncodeError, match=r"has no field 'body' \(text_field\); its fields: id, text"):
        read(null_text, text_field="body")
    odd = lines(tmp_path / "o.jsonl", [{"key": 1, "words": "x"}])
    with pytest.raises(EncodeError, match="no id field found .*looked for _id, id, .*hyperparameter id_field"):
        read(odd)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "text": "x"}\nnot json\n')
    with pytest.raises(EncodeError, match="bad.jsonl line 2 is not JSON"):
        read(tmp_path / "bad.jsonl")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("")
    with pytest.raises(EncodeError, match="no corpus file in .*empty \\(it holds readme.md\\)"):
        corpus.corpus_files(tmp_path / "empty")


def test_a_channel_holding_a_beir_set_reads_its_corpus_only(tmp_path):
    for name in ("corpus.jsonl", "queries.jsonl"):
        lines(tmp_path / name, [{"_id": "a", "text": "x"}])
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert [p.name for p in corpus.corpus_files(tmp_path)] == ["corpus.jsonl"]
