"""Tests for byoc.training.data: SageMaker channels -> normalised datasets."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import sys
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest

try:
    import byoc.training.data  # noqa: F401
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "container"))

from byoc.training.data import DataError, DataSpec, TaskData, load_task_data
from helpers import shared_data

# --------------------------------------------------------------------------- helpers


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, spec: DataSpec | None = None, **channels: Path) -> TaskData:
    return load_task_data(channels, spec or DataSpec(), tmp_path / "cache")


def error(tmp_path: Path, spec: DataSpec | None = None, **channels: Path) -> str:
    with pytest.raises(DataError) as info:
        load(tmp_path, spec, **channels)
    message = str(info.value)
    assert "Traceback" not in message and "\n" not in message
    return message


def rows(ds: datasets.Dataset) -> list[tuple]:
    return [tuple(r.values()) for r in ds]


def snapshot(root: Path) -> dict[str, float]:
    """Every path under root with its mtime (directories included)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in [root, *root.rglob("*")]}


CSV = "id,text,label\n1,good movie,pos\n2,bad movie,neg\n3,great film,pos\n4,awful,neg\n"


# --------------------------------------------------------------------------- file formats


def test_csv_detects_columns_and_drops_others(tmp_path):
    write(tmp_path / "train" / "data.csv", CSV)
    data = load(tmp_path, train=tmp_path / "train")
    assert data.train.column_names == ["text", "label"]
    assert data.train.features["label"] == datasets.Value("int64")
    assert data.label_names == ["neg", "pos"]
    assert rows(data.train) == [("good movie", 1), ("bad movie", 0), ("great film", 1), ("awful", 0)]
    assert data.eval is None and data.test is None and data.pretokenized is False


@pytest.mark.parametrize("sep", [",", ";", "\t", "|"])
def test_csv_delimiter_is_sniffed(tmp_path, sep):
    other = ";" if sep == "," else ","  # the text holds another candidate delimiter
    lines = ["sentence{0}sentiment", "it is fine{1} really{0}1", "no{0}0", "meh{1} ok{0}1"]
    write(tmp_path / "train" / "data.csv", "\n".join(line.format(sep, other) for line in lines) + "\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [(f"it is fine{other} really", 1), ("no", 0), (f"meh{other} ok", 1)]
    assert data.label_names == ["0", "1"]


def test_csv_quoted_fields_and_na_text(tmp_path):
    write(tmp_path / "train" / "d.csv", 'text,label\n"hello, ""world""\nbye",a\nNA,b\n')
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [('hello, "world"\nbye', 0), ("NA", 1)]


@pytest.mark.parametrize("content", ["text,label\nx,y,1\nw,0\n", "text,label\nx,1\ny,z,0\n"])
def test_csv_row_longer_than_header(tmp_path, content):
    write(tmp_path / "train" / "d.csv", content)
    message = error(tmp_path, train=tmp_path / "train")
    assert "d.csv" in message and "quote" in message


def test_tsv_keeps_quotes_literally(tmp_path):
    write(tmp_path / "train" / "d.tsv", 'sentence\tlabel\n"quoted" start\t1\nend "x\t0\n')
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [('"quoted" start', 1), ('end "x', 0)]


def test_headerless_csv_first_row_is_data(tmp_path):
    write(tmp_path / "train" / "d.tsv", "What a lovely little film\t1\nnope\t0\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [("What a lovely little film", 1), ("nope", 0)]


@pytest.mark.parametrize(
    "name, content",
    [
        ("d.json", json.dumps([{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])),
        ("d.json", json.dumps({"version": 1, "data": [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}]})),
        ("d.json", json.dumps({"text": ["a", "b"], "label": ["x", "y"]})),
        ("d.json", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n'),
        ("d.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "b", "label": "y"}\n'),
        ("d.ndjson", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}'),
    ],
    ids=["array", "data-key", "columnar", "json-lines-named-json", "jsonl", "ndjson"],
)
def test_json_variants(tmp_path, name, content):
    write(tmp_path / "train" / name, content)
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [("a", 0), ("b", 1)]
    assert data.label_names == ["x", "y"]


def test_parquet_keeps_classlabel_names_from_metadata(tmp_path):
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": [1, 1, 1]}, features=features)
    (tmp_path / "train").mkdir()
    ds.to_parquet(str(tmp_path / "train" / "part.parquet"))
    data = load(tmp_path, train=tmp_path / "train")
    assert data.label_names == ["neg", "pos"]  # not just the labels train happens to use
    assert rows(data.train) == [("a", 1), ("b", 1), ("c", 1)]


def test_gzipped_files(tmp_path):
    train = tmp_path / "train"
    write(train / "a.csv.gz", "text,label\nfrom csv,a\n")
    write(train / "b.jsonl.gz", '{"text": "from jsonl", "label": "b"}\n')
    write(train / "c.txt.gz", "from txt;a\n")
    buf = io.BytesIO()
    pd.DataFrame({"text": ["from parquet"], "label": ["b"]}).to_parquet(buf)
    (train / "d.parquet.gz").write_bytes(gzip.compress(buf.getvalue()))
    data = load(tmp_path, train=train)
    assert rows(data.train) == [("from csv", 0), ("from jsonl", 1), ("from txt", 0), ("from parquet", 1)]


def test_txt_with_header_splits_on_last_separator(tmp_path):
    write(tmp_path / "train" / "d.txt", "text;label_name\na;b;c;joy\r\nplain;sad\n\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [("a;b;c", 0), ("plain", 1)]
    assert data.label_names == ["joy", "sad"]


def test_txt_tab_without_header_numeric_labels_and_nel(tmp_path):
    write(tmp_path / "train" / "d.txt", "one\u0085still one; really  \t10\nx;y\t2\nz\t1\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [("one\u0085still one; really  ", 2), ("x;y", 1), ("z", 0)]
    assert data.label_names == ["1", "2", "10"]  # numeric order, not string order


def test_several_files_recursive_sorted_and_junk_skipped(tmp_path):
    train = tmp_path / "train"
    write(train / "b.csv", "text,label\nb,1\n")
    write(train / "a" / "z.csv", "text,label\naz,0\n")
    write(train / "c.jsonl", '{"text": "c", "label": 0}\n')
    for junk in ("_SUCCESS", ".hidden.csv", ".git/x.csv", "README.md", "manifest.json", "b.csv.crc", "notes.xlsx"):
        write(train / junk, "junk")
    data = load(tmp_path, train=train)
    assert rows(data.train) == [("az", 0), ("b", 1), ("c", 0)]


# --------------------------------------------------------------------------- channels and splits


def test_split_named_files_in_train_channel(tmp_path):
    train = tmp_path / "train"
    write(train / "train.csv", CSV)
    write(train / "dev.csv", "text,label\nok,pos\n")
    write(train / "test-00000.csv", "text,label\nmeh,neg\nfine,pos\n")
    write(train / "testimonials.csv", "text,label\nextra,pos\n")  # not a split name: train data
    data = load(tmp_path, train=train)
    assert len(data.train) == 5 and rows(data.eval) == [("ok", 1)] and len(data.test) == 2


def test_split_folders_in_train_channel(tmp_path):
    train = tmp_path / "train"
    write(train / "train" / "part-0.csv", CSV)
    write(train / "validation" / "part-0.csv", "text,label\nok,pos\n")
    data = load(tmp_path, train=train)
    assert len(data.train) == 4 and len(data.eval) == 1 and data.test is None


def test_separate_channel_wins_over_split_file(tmp_path):
    write(tmp_path / "train" / "train.csv", CSV)
    write(tmp_path / "train" / "val.csv", "text,label\nfrom train channel,pos\n")
    write(tmp_path / "validation" / "val.csv", "text,label\nfrom eval channel,neg\n")
    data = load(tmp_path, train=tmp_path / "train", validation=tmp_path / "validation")
    assert rows(data.eval) == [("from eval channel", 0)]


@pytest.mark.parametrize("eval_name", ["validation", "valid", "val", "eval", "dev", "evaluation"])
def test_separate_channels(tmp_path, eval_name):
    write(tmp_path / "tr" / "x.csv", CSV)
    write(tmp_path / "ev" / "train.csv", "text,label\ne,pos\n")  # names inside a separate channel don't matter
    write(tmp_path / "te" / "y.jsonl", '{"text": "t", "label": "neg"}\n')
    (tmp_path / "model").mkdir()
    channels = {
        "train": tmp_path / "tr",
        eval_name: tmp_path / "ev",
        "test": tmp_path / "te",
        "model": tmp_path / "model",
    }
    data = load_task_data(channels, DataSpec(), tmp_path / "cache")
    assert len(data.train) == 4 and rows(data.eval) == [("e", 1)] and rows(data.test) == [("t", 0)]


def _classlabel_dict() -> datasets.DatasetDict:
    features = datasets.Features(
        {
            "idx": datasets.Value("int32"),
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "neutral", "positive"]),
        }
    )

    def split(n: int, label: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"idx": list(range(n)), "sentence": [f"s{i}" for i in range(n)], "label": [label] * n}, features=features
        )

    return datasets.DatasetDict(
        {"train": split(6, 2), "validation": split(2, 0), "test": split(3, 2), "extra": split(1, 0)}
    )


def test_saved_datasetdict_in_train_channel(tmp_path):
    _classlabel_dict().save_to_disk(str(tmp_path / "train"))
    data = load(tmp_path, train=tmp_path / "train")
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.train.column_names == ["text", "label"]
    assert (len(data.train), len(data.eval), len(data.test)) == (6, 2, 3)
    assert set(data.train["label"]) == {2} and set(data.eval["label"]) == {0}


def test_saved_dataset_and_dict_in_separate_channels(tmp_path):
    dd = _classlabel_dict()
    dd["train"].save_to_disk(str(tmp_path / "train" / "nested"))  # one level of nesting is fine
    datasets.DatasetDict({"validation": dd["validation"], "test": dd["test"]}).save_to_disk(str(tmp_path / "val"))
    datasets.DatasetDict({"whatever": dd["test"]}).save_to_disk(str(tmp_path / "test"))
    data = load(tmp_path, train=tmp_path / "train", val=tmp_path / "val", test=tmp_path / "test")
    assert (len(data.train), len(data.eval), len(data.test)) == (6, 2, 3)


def test_saved_dict_without_matching_split_in_eval_channel(tmp_path):
    dd = _classlabel_dict()
    dd["train"].save_to_disk(str(tmp_path / "train"))
    datasets.DatasetDict({"a": dd["test"], "b": dd["test"]}).save_to_disk(str(tmp_path / "val"))
    message = error(tmp_path, train=tmp_path / "train", validation=tmp_path / "val")
    assert "splits a, b" in message and "validation" in message


def test_sentence_pairs(tmp_path):
    write(
        tmp_path / "train" / "train.jsonl", '{"premise": "p", "hypothesis": "h", "label": "entailment", "text": "x"}\n'
    )
    write(tmp_path / "train" / "test.csv", "Sentence1,Sentence2,label\na,b,entailment\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert data.train.column_names == ["text", "text_pair", "label"]
    assert rows(data.train) == [("p", "h", 0)] and rows(data.test) == [("a", "b", 0)]


def test_pair_in_one_split_only_is_an_error(tmp_path):
    write(tmp_path / "train" / "train.csv", "sentence1,sentence2,label\na,b,x\n")
    write(tmp_path / "train" / "test.csv", "text,label\na,x\n")
    assert "sentence pairs" in error(tmp_path, train=tmp_path / "train")


def test_explicit_columns_override_detection(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,body,label,stars\nignored,used,x,5\nignored,used too,y,4\n")
    spec = DataSpec(text_column="body", label_column="STARS")  # case-insensitive match
    data = load(tmp_path, spec, train=tmp_path / "train")
    assert rows(data.train) == [("used", 1), ("used too", 0)] and data.label_names == ["4", "5"]
    spec = DataSpec(text_column="text", text_pair_column="body")
    assert load(tmp_path, spec, train=tmp_path / "train").train.column_names == ["text", "text_pair", "label"]


def test_two_column_fallback(tmp_path):
    write(tmp_path / "train" / "d.csv", "words,outcome\nsome text,1\nmore text,0\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert rows(data.train) == [("some text", 1), ("more text", 0)]


# --------------------------------------------------------------------------- labels


def test_integer_labels_zero_based_keep_ids(tmp_path):
    write(tmp_path / "train" / "d.jsonl", "".join(json.dumps({"text": "t", "label": i}) + "\n" for i in (2, 0, 1)))
    data = load(tmp_path, train=tmp_path / "train")
    assert data.train["label"] == [2, 0, 1] and data.label_names == ["0", "1", "2"]


def test_sparse_integer_and_integral_float_labels_are_mapped(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,rating\na,5.0\nb,1.0\nc,3.0\n")
    write(tmp_path / "validation" / "v.txt", "d;3\n")
    data = load(tmp_path, train=tmp_path / "train", validation=tmp_path / "validation")
    assert data.train["label"] == [2, 0, 1] and data.label_names == ["1", "3", "5"]
    assert data.eval["label"] == [1]


def test_fractional_labels_mean_regression_and_a_classifier_refuses_them(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,label\na,0.5\nb,1\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert data.task == "regression" and data.train["label"] == [0.5, 1.0] and data.label_names == ["label"]
    message = error(tmp_path, DataSpec(task="single_label_classification"), train=tmp_path / "train")
    assert "task=regression" in message and "0.5" in message


def test_unknown_label_in_eval(tmp_path):
    write(tmp_path / "train" / "train.csv", CSV)
    write(tmp_path / "train" / "val.csv", "text,label\na,pos\nb,meh\nc,meh\n")
    message = error(tmp_path, train=tmp_path / "train")
    assert "'meh'" in message and "eval" in message and "neg, pos" in message and "row 2" in message


def test_classlabel_eval_with_plain_string_labels(tmp_path):
    _classlabel_dict()["train"].save_to_disk(str(tmp_path / "train"))
    write(tmp_path / "test" / "t.csv", "sentence,label\na,neutral\nb,positive\n")
    data = load(tmp_path, train=tmp_path / "train", test=tmp_path / "test")
    assert data.test["label"] == [1, 2]


def test_missing_label(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,label\na,x\nb,\nc,y\nd,\n")
    message = error(tmp_path, train=tmp_path / "train")
    assert "train" in message and "'label'" in message and "2 of 4 rows" in message and "row 2" in message


def test_empty_text(tmp_path):
    write(tmp_path / "train" / "d.jsonl", '{"text": "a", "label": 1}\n{"text": "  ", "label": 0}\n{"label": 0}\n')
    message = error(tmp_path, train=tmp_path / "train")
    assert "'text'" in message and "2 of 3 rows" in message and "row 2" in message


def test_classlabel_minus_one_is_missing(tmp_path):
    dd = _classlabel_dict()
    dd["test"] = dd["test"].map(lambda r: {"label": -1}, features=dd["test"].features)
    dd.save_to_disk(str(tmp_path / "train"))
    message = error(tmp_path, train=tmp_path / "train")
    assert "test" in message and "'label'" in message and "3 of 3 rows" in message


# --------------------------------------------------------------------------- pretokenized


def test_pretokenized_saved_dataset_with_classlabel(tmp_path):
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "attention_mask": datasets.Sequence(datasets.Value("int8")),
            "label": datasets.ClassLabel(names=["no", "yes"]),
            "text": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2], [3]] * 5, "attention_mask": [[1, 1], [1]] * 5, "label": [0, 1] * 5, "text": ["t"] * 10},
        features=features,
    )
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "train"))
    before = snapshot(tmp_path / "train")
    data = load(tmp_path, DataSpec(validation_split=0.2), train=tmp_path / "train")
    assert data.pretokenized and data.label_names == ["no", "yes"]
    assert data.train.column_names == ["input_ids", "attention_mask", "labels"]
    assert data.train.features["labels"] == datasets.Value("int64")
    assert (len(data.train), len(data.eval), len(data.test)) == (8, 2, 2)
    assert sorted(data.eval["labels"]) == [0, 1]  # stratified
    assert snapshot(tmp_path / "train") == before


def test_pretokenized_jsonl_label_names_from_max(tmp_path):
    lines = [
        {"input_ids": [1, 2], "token_type_ids": [0, 0], "labels": 3, "note": "x"},
        {"input_ids": [5], "token_type_ids": [0], "labels": 1, "note": "y"},
    ]
    write(tmp_path / "train" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    write(tmp_path / "train" / "test.jsonl", json.dumps({"input_ids": [1], "token_type_ids": [0], "labels": 4}) + "\n")
    message = error(tmp_path, train=tmp_path / "train")
    assert "label id 4" in message and "test" in message
    (tmp_path / "train" / "test.jsonl").unlink()
    data = load(tmp_path, train=tmp_path / "train")
    assert data.label_names == ["0", "1", "2", "3"]
    assert data.train.column_names == ["input_ids", "token_type_ids", "labels"] and data.train["labels"] == [3, 1]


def test_pretokenized_label_id_far_beyond_the_labels_is_refused_before_naming_them(tmp_path):
    """An id of 10^12 built 10^12 label names: MemoryError after 27 s, blamed on the batch size (issue 21)."""
    lines = [{"input_ids": [1, 2], "labels": 0}, {"input_ids": [3], "labels": 10**12}, {"input_ids": [4], "labels": 1}]
    write(tmp_path / "train" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    message = error(tmp_path, train=tmp_path / "train")  # not a MemoryError: the id is refused first
    for words in ("label id 1000000000000", "column 'labels'", "999999", "row 2", "renumber them 0..K-1"):
        assert words in message, message


def test_pretokenized_negative_label_id_is_named_not_called_missing(tmp_path):
    write(tmp_path / "train" / "train.jsonl", '{"input_ids": [1], "target": 0}\n{"input_ids": [2], "target": -3}\n')
    message = error(tmp_path, DataSpec(label_column="target"), train=tmp_path / "train")
    assert "negative label id -3 in column 'target'" in message and "row 2" in message, message


def test_pretokenized_classlabel_id_past_its_names_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = datasets.Features(
        {"input_ids": datasets.Sequence(datasets.Value("int64")), "label": datasets.ClassLabel(names=["no", "yes"])}
    )
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]], "label": [0, 1]}, features=features)
    (tmp_path / "train").mkdir()
    ds.to_parquet(str(tmp_path / "train" / "part.parquet"))
    table = pq.read_table(tmp_path / "train" / "part.parquet")  # the schema keeps 2 names; the data gets id 2
    table = table.set_column(1, table.schema.field(1), pa.array([0, 2], table.schema.field(1).type))
    pq.write_table(table, tmp_path / "train" / "part.parquet")
    message = error(tmp_path, train=tmp_path / "train")
    assert "label id 2, beyond its 2 ClassLabel names (ids 0..1) in column 'label'" in message, message


def test_pretokenized_parquet_and_separate_channel_over_saved_split(tmp_path):
    frame = pd.DataFrame({"input_ids": [[1, 2], [3]], "attention_mask": [[1, 1], [1]], "label": [0, 2]})
    (tmp_path / "train").mkdir()
    frame.to_parquet(tmp_path / "train" / "train.parquet")
    ds = datasets.Dataset.from_pandas(frame)
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "test").mkdir()
    frame.to_parquet(tmp_path / "test" / "test.parquet")
    for _ in range(2):  # a second load with the same cache_dir must not clobber the first one's copy
        first = load(tmp_path, train=tmp_path / "train")
        data = load(tmp_path, train=tmp_path / "saved", test=tmp_path / "test")
    assert first.label_names == ["0", "1", "2"] and first.train["labels"] == [0, 2]
    assert first.train.features["labels"] == datasets.Value("int64")
    assert len(data.train) == 2 and len(data.test) == 2  # the test channel wins over the saved 'test' split


def test_pretokenized_without_labels(tmp_path):
    write(tmp_path / "train" / "d.jsonl", '{"input_ids": [1, 2], "target": 1}\n')
    message = error(tmp_path, train=tmp_path / "train")
    assert "labels" in message and "label_column" in message and "target" in message


def test_pretokenized_and_text_splits_mixed(tmp_path):
    write(tmp_path / "train" / "train.jsonl", '{"input_ids": [1, 2], "label": 1}\n')
    write(tmp_path / "train" / "test.csv", "text,label\na,1\n")
    assert "pretokenized" in error(tmp_path, train=tmp_path / "train")


# --------------------------------------------------------------------------- eval hold-out and limits


def test_validation_split_is_stratified_and_seeded(tmp_path):
    lines = "".join(f"text {i};{'a' if i % 4 else 'b'}\n" for i in range(100))
    write(tmp_path / "train" / "d.txt", lines)
    spec = DataSpec(validation_split=0.2, seed=7)
    first, second = load(tmp_path, spec, train=tmp_path / "train"), load(tmp_path, spec, train=tmp_path / "train")
    assert (len(first.train), len(first.eval)) == (80, 20)
    assert first.eval["text"] == second.eval["text"]
    assert sorted(first.eval["label"]).count(1) == 5  # 'b' is 25% of train and of eval
    assert not set(first.eval["text"]) & set(first.train["text"])
    other = load(tmp_path, DataSpec(validation_split=0.2, seed=8), train=tmp_path / "train")
    assert other.eval["text"] != first.eval["text"]


def test_validation_split_not_used_when_eval_exists(tmp_path):
    write(tmp_path / "train" / "train.csv", CSV)
    write(tmp_path / "train" / "val.csv", "text,label\nv,pos\n")
    data = load(tmp_path, DataSpec(validation_split=0.5), train=tmp_path / "train")
    assert len(data.train) == 4 and len(data.eval) == 1


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_invalid_validation_split(tmp_path, value):
    write(tmp_path / "train" / "d.csv", CSV)
    assert "validation_split" in error(tmp_path, DataSpec(validation_split=value), train=tmp_path / "train")


def test_validation_split_too_small_for_data(tmp_path):
    write(tmp_path / "train" / "d.csv", CSV)
    assert "validation_split" in error(tmp_path, DataSpec(validation_split=0.01), train=tmp_path / "train")


def test_max_samples(tmp_path):
    write(tmp_path / "train" / "train.txt", "".join(f"t{i};{i % 2}\n" for i in range(10)))
    write(tmp_path / "train" / "val.txt", "".join(f"v{i};{i % 2}\n" for i in range(10)))
    write(tmp_path / "train" / "test.txt", "".join(f"s{i};{i % 2}\n" for i in range(10)))
    data = load(tmp_path, DataSpec(max_train_samples=3, max_eval_samples=2), train=tmp_path / "train")
    assert data.train["text"] == ["t0", "t1", "t2"] and data.eval["text"] == ["v0", "v1"] and len(data.test) == 2


# --------------------------------------------------------------------------- errors


def test_no_train_channel(tmp_path):
    (tmp_path / "validation").mkdir()
    message = error(tmp_path, validation=tmp_path / "validation", code=tmp_path)
    assert "'train' channel" in message and "validation" in message and "code" not in message


def test_empty_channel(tmp_path):
    (tmp_path / "train").mkdir()
    assert "empty" in error(tmp_path, train=tmp_path / "train")


def test_no_readable_files(tmp_path):
    write(tmp_path / "train" / "data.xlsx", "x")
    write(tmp_path / "train" / "README.md", "x")
    message = error(tmp_path, train=tmp_path / "train")
    assert (
        "No readable data files" in message and "data.xlsx" in message and ".csv" in message and ".parquet" in message
    )


def test_only_eval_files_in_train_channel(tmp_path):
    write(tmp_path / "train" / "test.csv", CSV)
    assert "training data" in error(tmp_path, train=tmp_path / "train")


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_empty_dataset(tmp_path, content):
    write(tmp_path / "train" / "d.csv", content)
    assert "no rows" in error(tmp_path, train=tmp_path / "train")


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("bad.json", '[{"text": "a", "label": 1},', "bad.json"),
        ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": oops}\n', "line 2"),
        ("bad.parquet", "not parquet at all", "bad.parquet"),
        ("bad.csv.gz", "not gzip", "bad.csv.gz"),
        ("bad.txt", "no separator here\n", "separator"),
        ("bad.json", '{"a": 1}', "list of records"),
    ],
)
def test_unparseable_file(tmp_path, name, content, expected):
    path = tmp_path / "train" / name
    path.parent.mkdir()
    path.write_text(content)
    assert expected in error(tmp_path, train=tmp_path / "train")


def test_not_utf8(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "d.csv").write_bytes("text,label\ncaf\xe9,1\n".encode("latin-1"))
    assert "UTF-8" in error(tmp_path, train=tmp_path / "train")


def test_explicit_column_missing_suggests_closest(tmp_path):
    write(tmp_path / "train" / "d.csv", CSV)
    message = error(tmp_path, DataSpec(label_column="lable"), train=tmp_path / "train")
    assert "label_column 'lable'" in message and "id, text, label" in message and "Did you mean 'label'" in message


def test_no_text_column(tmp_path):
    write(tmp_path / "train" / "d.csv", "a,b,label\n1,2,x\n")
    message = error(tmp_path, train=tmp_path / "train")
    assert "text column" in message and "a, b, label" in message and "text_column" in message


def test_no_label_column(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,a,b\nx,1,2\n")
    message = error(tmp_path, train=tmp_path / "train")
    assert "label column" in message and "text, a, b" in message and "label_column" in message


def test_channel_directory_is_left_untouched(tmp_path):
    train = tmp_path / "train"
    write(train / "train.csv.gz", CSV.replace("pos", "positive").replace("neg", "negative"))
    write(train / "val.jsonl", '{"text": "a", "label": "positive"}\n')
    _classlabel_dict()["test"].save_to_disk(str(tmp_path / "test"))
    before = snapshot(train), snapshot(tmp_path / "test")
    data = load(tmp_path, DataSpec(), train=train, test=tmp_path / "test")
    data.test.map(lambda r: {"text": r["text"].upper()})  # later processing must not write there either
    assert (snapshot(train), snapshot(tmp_path / "test")) == before


# --------------------------------------------------------------------------- real sample data


def test_real_emotion_files(tmp_path):
    for name in ("train.txt", "val.txt", "test.txt"):
        shutil.copy(shared_data.folder("emotion") / name, tmp_path / name)
    data = load(tmp_path, train=tmp_path)
    assert (len(data.train), len(data.eval), len(data.test)) == (16000, 2000, 2000)
    assert data.label_names == ["anger", "fear", "joy", "love", "sadness", "surprise"]
    assert data.train[0] == {"text": "i didnt feel humiliated", "label": 4}
    assert data.train["label"].count(data.label_names.index("surprise")) == 572


def test_real_uci_yelp_and_imdb(tmp_path):
    for name in ("yelp_labelled.txt", "imdb_labelled.txt"):
        shutil.copy(shared_data.folder("uci-sentiment") / name, tmp_path / name)
    data = load(tmp_path, train=tmp_path)
    assert len(data.train) == 2000  # the U+0085 characters in imdb must not split rows
    assert data.label_names == ["0", "1"] and data.train["label"].count(1) == 1000
    assert sum("\u0085" in t for t in data.train["text"]) == 2


def test_training_and_testing_channel_names(tmp_path):
    train, test = tmp_path / "training", tmp_path / "testing"
    for folder, n in ((train, 6), (test, 2)):
        folder.mkdir()
        (folder / "d.csv").write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(n)))
    data = load_task_data({"training": train, "testing": test}, DataSpec(), tmp_path / "cache")
    assert len(data.train) == 6 and len(data.test) == 2


# --------------------------------------------------------------------------- tasks: multi-label, regression


def test_label_lists_mean_multi_label_and_an_empty_list_means_no_label(tmp_path):
    rows = [{"text": "a", "labels": ["joy", "love"]}, {"text": "b", "labels": []}, {"text": "c", "labels": ["anger"]}]
    write(tmp_path / "train" / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write(tmp_path / "test" / "t.jsonl", json.dumps({"text": "d", "labels": ["love"]}) + "\n")
    data = load(tmp_path, train=tmp_path / "train", test=tmp_path / "test")
    assert data.task == "multi_label_classification" and data.label_names == ["anger", "joy", "love"]
    assert data.train["label"] == [[1, 2], [], [0]] and data.test["label"] == [[2]]  # each row's label ids


def test_multi_label_data_is_held_as_each_rows_labels_not_rows_times_labels(tmp_path):
    """500 rows of 20,000 labels were a 40 MB float32 matrix before a step ran (50,000 rows: 4 GB, and an
    extreme multi-label job was killed for memory); the data holds each row's label ids instead."""
    import tracemalloc

    rows = [{"text": f"t{i}", "labels": [f"l{(i * 7 + k) % 20_000}" for k in range(3)]} for i in range(500)]
    rows.append({"text": "every label once", "labels": [f"l{n}" for n in range(20_000)]})
    write(tmp_path / "train" / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    tracemalloc.start()
    try:
        data = load(tmp_path, train=tmp_path / "train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data.label_names) == 20_000 and data.task == "multi_label_classification"
    assert peak < 24 * 2**20, peak
    first = data.train["label"][0]
    assert [data.label_names[i] for i in first] == sorted(rows[0]["labels"], key=data.label_names.index)


def test_a_saved_dataset_with_a_sequence_of_class_labels(tmp_path):
    names = ["anger", "joy", "love", "unused"]
    features = datasets.Features(
        {"text": datasets.Value("string"), "labels": datasets.Sequence(datasets.ClassLabel(names=names))}
    )
    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "labels": [[1, 2], [0]]}, features=features)
    ds.save_to_disk(str(tmp_path / "train"))
    data = load(tmp_path, train=tmp_path / "train")
    assert data.task == "multi_label_classification" and data.label_names == names  # unused labels kept
    assert data.train["label"] == [[1, 2], [0]]


def test_label_ids_in_lists_and_parquet_arrays(tmp_path):
    frame = pd.DataFrame({"text": ["a", "b", "c"], "label": [[3, 1], [1], []]})
    (tmp_path / "train").mkdir()
    frame.to_parquet(tmp_path / "train" / "d.parquet")  # lists come back as numpy arrays
    data = load(tmp_path, train=tmp_path / "train")
    assert data.label_names == ["1", "3"] and data.train["label"] == [[0, 1], [0], []]


def test_text_labels_split_on_the_delimiter_when_asked(tmp_path):
    write(tmp_path / "train" / "d.csv", 'text,label\na,"joy, love"\nb,joy\n')
    data = load(tmp_path, DataSpec(task="multi_label_classification"), train=tmp_path / "train")
    assert data.label_names == ["joy", "love"] and data.train["label"] == [[0, 1], [0]]
    piped = load(tmp_path, DataSpec(task="multi_label_classification", label_delimiter="|"), train=tmp_path / "train")
    assert piped.label_names == ["joy", "joy, love"]  # no "|": each text is one label
    assert load(tmp_path, train=tmp_path / "train").task == "single_label_classification"  # auto: one class


def test_binary_label_columns_are_found_beside_an_id_column(tmp_path):
    write(tmp_path / "train" / "d.csv", "id,comment_text,toxic,insult\n7,you are bad,1,1\n8,hello,0,0\n9,meh,1,0\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert data.task == "multi_label_classification" and data.label_names == ["toxic", "insult"]
    assert data.train["text"] == ["you are bad", "hello", "meh"] and data.train["label"][0] == [0, 1]
    chosen = load(tmp_path, DataSpec(label_columns=["insult"]), train=tmp_path / "train")
    assert chosen.label_names == ["insult"] and chosen.train["label"] == [[0], [], []]


def test_a_label_column_that_is_not_zero_or_one(tmp_path):
    write(tmp_path / "train" / "d.csv", "text,toxic,insult\na,1,1\nb,0,2\n")
    message = error(tmp_path, DataSpec(label_columns=["toxic", "insult"]), train=tmp_path / "train")
    assert "'insult'" in message and "row 2" in message and "0 or 1" in message


def test_fractional_numbers_mean_regression_and_whole_ones_on_request(tmp_path):
    write(tmp_path / "train" / "d.tsv", "sentence1\tsentence2\tscore\na\tb\t4.5\nc\td\t1\n")
    data = load(tmp_path, train=tmp_path / "train")
    assert data.task == "regression" and data.label_names == ["score"] and data.train["label"] == [4.5, 1.0]
    write(tmp_path / "stars" / "d.csv", "text,rating\na,5\nb,1\n")
    stars = load(tmp_path, DataSpec(task="regression"), train=tmp_path / "stars")
    assert stars.task == "regression" and stars.train["label"] == [5.0, 1.0]


@pytest.mark.parametrize(
    "spec,content,words",
    [
        (DataSpec(task="regression"), "text,label\na,1\nb,neg\n", ["task=regression", "'neg'", "row 2"]),
        (DataSpec(), '{"text": "a", "label": 2.5}\n{"text": "b", "label": -Infinity}\n', ["finite", "row 2"]),
        (DataSpec(), '{"text": "a", "label": ["x"]}\n{"text": "b", "label": "x"}\n', ["mixes label kinds", "row 2"]),
        (DataSpec(task="single_label_classification"), '{"text": "a", "label": ["x"]}\n', ["multi_label"]),
    ],
)
def test_labels_the_task_cannot_take(tmp_path, spec, content, words):
    write(tmp_path / "train" / ("d.jsonl" if content.startswith("{") else "d.csv"), content)
    message = error(tmp_path, spec, train=tmp_path / "train")
    for word in words:
        assert word in message, message


def test_an_unknown_label_in_a_test_list_names_its_row(tmp_path):
    write(tmp_path / "train" / "d.jsonl", json.dumps({"text": "a", "labels": ["joy"]}) + "\n")
    rows = [{"text": "a", "labels": []}, {"text": "b", "labels": ["joy", "awe"]}]
    write(tmp_path / "test" / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    message = error(tmp_path, train=tmp_path / "train", test=tmp_path / "test")
    assert "test data" in message and "'awe'" in message and "row 2" in message


def test_the_hold_out_is_stratified_for_regression_and_label_sets(tmp_path):
    from byoc.training.data.labels import holdout

    values = np.concatenate([np.linspace(0, 1, 50), np.linspace(100, 101, 50)]).astype(np.float32)
    _, eval_idx = holdout(values, 0.2, seed=1)
    assert len(eval_idx) == 20 and (values[eval_idx] > 50).sum() == 10  # each half of the range keeps its share
    sets = np.array([[1, 0]] * 30 + [[0, 1]] * 10, dtype=np.float32)
    _, eval_sets = holdout(sets, 0.25, seed=1)
    assert sets[eval_sets][:, 1].sum() in (2, 3)  # a quarter of the ten [0, 1] rows


# --------------------------------------------------------------------------- token classification


def test_the_wnut17_conll_files_read_with_their_published_counts(tmp_path):
    wnut = shared_data.folder("wnut17")
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    shutil.copy(wnut / "wnut17train.conll", tmp_path / "train" / "train.conll")
    shutil.copy(wnut / "emerging.test.annotated", tmp_path / "test" / "test.txt")  # a .txt that reads as CoNLL
    data = load(tmp_path, train=tmp_path / "train", test=tmp_path / "test")
    assert data.task == "token_classification" and (len(data.train), len(data.test)) == (3394, 1287)
    assert len(data.label_names) == 13 and data.label_names[0] == "O"
    assert sum(len(t) for t in data.train["tokens"]) == 62730


def test_iob1_tags_become_iob2_and_records_with_tag_names_read(tmp_path):
    rows = [{"tokens": ["John", "Smith", "in", "New", "York"], "ner_tags": ["I-PER", "I-PER", "O", "I-LOC", "I-LOC"]}]
    write(tmp_path / "train" / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    data = load(tmp_path, train=tmp_path / "train")
    assert data.label_names == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert [data.label_names[t] for t in data.train["tags"][0]] == ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]


@pytest.mark.parametrize(
    "name,content,words",
    [
        ("d.conll", "a O\nb B-X\n\nc O extra\n", ["line 4", "the lines before have 2"]),
        ("d.conll", "a O\nb B-X\nc PERSON\n", ["'PERSON'", "line 3", "not an IOB tag"]),
        ("d.jsonl", '{"tokens": [], "ner_tags": []}\n', ["no tokens", "row 1"]),
        ("d.jsonl", '{"tokens": ["a", "b"], "ner_tags": ["O"]}\n', ["2 tokens but 1 tags", "row 1"]),
        ("d.jsonl", '{"tokens": ["a"], "ner_tags": [3]}\n', ["tag ids without their names"]),
    ],
)
def test_token_data_the_job_cannot_take(tmp_path, name, content, words):
    write(tmp_path / "train" / name, content)
    message = error(tmp_path, train=tmp_path / "train")
    for word in words:
        assert word in message, message


def test_a_test_tag_that_train_lacks_names_its_line(tmp_path):
    write(tmp_path / "train" / "d.conll", "a B-PER\nb O\n")
    write(tmp_path / "test" / "d.conll", "a O\n\nb B-PER\nc B-ORG\n")
    message = error(tmp_path, train=tmp_path / "train", test=tmp_path / "test")
    assert "'B-ORG'" in message and "line 4" in message and "test data" in message


def test_a_missing_regression_label_names_its_row(tmp_path):
    write(tmp_path / "train" / "d.jsonl", '{"text": "a", "label": 1.5}\n{"text": "b", "label": NaN}\n')
    message = error(tmp_path, train=tmp_path / "train")
    assert "no value" in message and "row 2" in message


# --- an embedding model's data -----------------------------------------------------------------------------


def test_anchor_positive_negative_rows_are_an_embedding_models_data(tmp_path):
    train = write(
        tmp_path / "train/train.jsonl",
        "".join(
            json.dumps({"Anchor": f"q{i}", "positive": f"p{i}", "negative": f"n{i}", "id": i}) + "\n" for i in range(4)
        ),
    )
    data = load(tmp_path, train=train.parent)
    assert data.task == "embedding" and data.label_names == []
    assert data.train.column_names == ["text", "text_pair", "text_negative", "label"]
    assert data.train[1]["text"] == "q1" and data.train[1]["text_negative"] == "n1"
    assert all(np.isnan(score) for score in data.train["label"])  # no scores: in-batch negatives


def test_query_positive_csv_with_a_validation_split_held_out(tmp_path):
    train = write(tmp_path / "train/train.csv", "query,positive\n" + "".join(f"q {i},p {i}\n" for i in range(20)))
    data = load(tmp_path, DataSpec(validation_split=0.25), train=train.parent)
    assert data.task == "embedding" and len(data.train) == 15 and len(data.eval) == 5
    assert data.train.column_names == ["text", "text_pair", "label"]


def test_an_embedding_models_eval_data_may_have_the_other_layout(tmp_path):
    """Rows trained, scored pairs evaluated (the Spearman of the cosine); negatives only where training has them."""
    rows = "".join(json.dumps({"anchor": f"q{i}", "positive": f"p{i}", "negative": f"n{i}"}) + "\n" for i in range(4))
    train = write(tmp_path / "train/t.jsonl", rows)
    dev = write(tmp_path / "validation/dev.csv", "sentence1,sentence2,score\na,b,1.5\nc,d,4\n")
    test = write(tmp_path / "test/t.jsonl", '{"query": "a", "positive": "b"}\n')
    data = load(tmp_path, train=train.parent, validation=dev.parent, test=test.parent)
    assert data.task == "embedding" and data.eval["label"] == [1.5, 4.0]
    assert data.test.column_names == ["text", "text_pair", "label"]  # no negative: evaluated all the same
    # Scored pairs trained, rows evaluated (MRR and recall).
    train = write(tmp_path / "scored/t.csv", "sentence1,sentence2,score\na,b,1.5\nc,d,4\n")
    data = load(tmp_path, DataSpec(task="embedding"), train=train.parent, test=test.parent)
    assert data.label_names == ["score"] and np.isnan(data.test["label"]).all()


def test_scored_pairs_train_an_embedding_model_when_asked(tmp_path):
    train = write(tmp_path / "train/t.csv", "sentence1,sentence2,score\na b,a c,4.5\nd e,f g,0.5\nh,h i,3\n")
    data = load(tmp_path, DataSpec(task="embedding"), train=train.parent)
    assert data.task == "embedding" and data.label_names == ["score"]
    assert data.train["label"] == [4.5, 0.5, 3.0] and data.train[0]["text_pair"] == "a c"


@pytest.mark.parametrize(
    ("files", "task", "expected"),
    [
        (
            {"train": ("t.jsonl", '{"anchor": "a", "positive": "b"}\n')},
            "regression",
            "drop task (or set task=embedding)",
        ),
        ({"train": ("t.csv", "text,label\nhello,1.5\nworld,2\n")}, "embedding", "anchor (or query) column"),
        (
            {"train": ("t.csv", "sentence1,sentence2,label\na,b,x\nc,d,y\n")},
            "embedding",
            "task=embedding needs numeric",
        ),
        (
            {"train": ("t.jsonl", '{"anchor": "a", "positive": "b"}\n'), "test": ("t.csv", "text,label\nc,1\n")},
            "auto",
            "The test data (t.csv in",
        ),
        ({"train": ("t.jsonl", '{"anchor": "a", "positive": ""}\n')}, "auto", "no value in column 'positive'"),
    ],
)
def test_embedding_data_that_cannot_train_says_what_to_change(tmp_path, files, task, expected):
    channels = {role: write(tmp_path / role / name, text).parent for role, (name, text) in files.items()}
    assert expected in error(tmp_path, DataSpec(task=task), **channels)


@pytest.mark.parametrize(
    "task", ["sparse_embedding", "multi_vector", "generative_reranker", "reranker", "listwise_reranker", "embedding"]
)
def test_a_retrieval_tasks_refusal_of_text_label_rows_names_the_task_that_was_set(tmp_path, task):
    """A text,label CSV with task=sparse_embedding was told "drop task=embedding to classify by name": the
    message names the task set, and what that task's rows hold."""
    train = write(tmp_path / "train/t.csv", "text,label\nhello,positive\nworld,negative\n")
    message = error(tmp_path, DataSpec(task=task), train=train.parent)
    assert f"drop task={task} to classify by name" in message and f"(task={task}) trains on" in message, message
    others = {"embedding", "sparse_embedding", "multi_vector", "generative_reranker", "reranker"} - {task}
    assert not any(f"task={other}" in message for other in others), message


def test_an_integer_past_float64s_range_is_an_infinite_label_whatever_pandas_makes_of_it():
    """pandas 3 keeps a 400-digit integer a Python int (an object column), which every float conversion after
    fails on: the GPU machine's job failed with "unexpected error: OverflowError" instead of naming the row."""
    from byoc.training.data.labels import as_numbers

    numbers = as_numbers(pd.Series(["1", "9" * 400]))
    assert numbers is not None and numbers.dtype == np.float64
    assert numbers.tolist() == [1.0, float("inf")]
