"""byoc.training.data.beir: a retrieval set in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)."""

from __future__ import annotations

import pytest

from byoc.training.data import DataError
from byoc.training.data.beir import find_layout, read_set, split_retrieval_channels
from helpers import TOPICS, write_beir, write_jsonl


def test_a_set_reads_documents_as_title_and_text_and_keeps_the_judged_queries(tmp_path):
    found = read_set(write_beir(tmp_path / "test"), "test", "test")
    assert found.corpus["cooking-0"] == "cooking a recipe for bread"  # title, a space, the text
    assert found.corpus["cooking-1"] == TOPICS["cooking"][1]  # no title: the text alone
    assert set(found.queries) == {f"q-{topic}" for topic in TOPICS}  # the unjudged query is not evaluated
    assert found.relevant["q-cooking"] == {"cooking-0", "cooking-1", "cooking-2"}  # a score of 0 is not relevant
    assert found.role == "test"


def test_the_set_may_sit_in_the_channels_one_folder(tmp_path):
    write_beir(tmp_path / "channel" / "scifact")
    assert find_layout(tmp_path / "channel") == tmp_path / "channel" / "scifact"
    assert find_layout(tmp_path / "nothing") is None


def test_the_qrels_file_is_the_one_named_for_the_split_or_the_only_one(tmp_path):
    folder = write_beir(tmp_path / "set", qrels_name="dev")
    assert read_set(folder, "eval", "validation").relevant  # dev.tsv for the eval channel
    assert read_set(folder, "test", "test").relevant  # the only file, whatever its name
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(DataError, match=r"several qrels files \(dev.tsv, train.tsv\).*qrels/test.tsv"):
        read_set(folder, "test", "test")


def test_the_channels_in_beir_layout_are_taken_apart_from_those_holding_rows(tmp_path):
    channels = {"train": tmp_path / "train", "test": write_beir(tmp_path / "test"), "validation": tmp_path / "val"}
    channels["train"].mkdir()
    channels["validation"].mkdir()
    (channels["validation"] / "val.csv").write_text("a,b\n")
    rows, sets = split_retrieval_channels(channels)
    assert rows == {"train": tmp_path / "train", "validation": tmp_path / "val"}
    assert list(sets) == ["test"]


def _write(name: str, text: str):
    return lambda folder: (folder / name).write_text(text)


QRELS = "qrels/test.tsv"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "queries.jsonl").unlink(), r"has no queries.jsonl"),
        (_write("corpus.jsonl", '{"_id": "a", "text": "x"}\nnot json\n'), r"corpus.jsonl .* line 2: not JSON"),
        (lambda f: write_jsonl(f / "queries.jsonl", [{"text": "no id"}]), r"line 1: a record needs an \"_id\""),
        (_write(QRELS, "q-x\tmissing\t1\n"), r"judge queries q-x .*documents missing"),
        (_write(QRELS, "q-cooking\tcooking-0\n"), r"line 1: expected query-id"),
        (_write(QRELS, "q-cooking\tcooking-0\t0\n"), r"No query .* has a relevant"),
        (lambda f: (f / QRELS).unlink(), r"has no qrels/test.tsv"),
    ],
    ids=["no-queries", "bad-json", "no-id", "unknown-ids", "two-columns", "nothing-relevant", "no-qrels"],
)
def test_a_malformed_set_is_refused_saying_which_file_and_what(tmp_path, damage, message):
    folder = write_beir(tmp_path / "test")
    damage(folder)
    with pytest.raises(DataError, match=message):
        read_set(folder, "test", "test")
