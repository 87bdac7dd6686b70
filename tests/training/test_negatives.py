"""byoc.training.negatives: hard negatives mined before an embedding model's training
(`mine_hard_negatives=true`, sentence-transformers' util.mine_hard_negatives), and the in-batch check."""

from __future__ import annotations

import dataclasses

import datasets
import pytest

from byoc import tasks
from byoc.training import entry
from byoc.training.arguments import HyperparameterError
from byoc.training.data import TaskData
from byoc.training.hyperparameters import parse_hyperparameters
from byoc.training.model import bundled_model_dir
from byoc.training.negatives import NEGATIVE, mine_hard_negatives
from helpers import topic_rows, write_jsonl

ROWS = topic_rows(40)


def rows_data(rows: list[dict]) -> TaskData:
    train = datasets.Dataset.from_dict(
        {
            "text": [r["anchor"] for r in rows],
            "text_pair": [r["positive"] for r in rows],
            "label": [float("nan")] * len(rows),
        }
    )
    return TaskData(train=train, eval=None, test=None, label_names=[], pretokenized=False, task=tasks.EMBEDDING)


def test_each_row_gets_a_negative_that_is_another_rows_positive_within_the_range(caplog):
    """MiniLM as the miner: every row keeps its place and gets a negative, never its own positive; the mined
    ones are those util.mine_hard_negatives gives for the same rows."""
    args = parse_hyperparameters(
        {"mine_hard_negatives": "true", "negatives_range_min": "1", "negatives_range_max": "10", "max_length": "64"}
    )
    data = rows_data(ROWS)
    with caplog.at_level("INFO", logger="byoc.training.negatives"):
        mined = mine_hard_negatives(data, str(bundled_model_dir()), args)
    assert mined.train["text"] == data.train["text"] and mined.train["text_pair"] == data.train["text_pair"]
    positives = set(data.train["text_pair"])
    for positive, negative in zip(mined.train["text_pair"], mined.train[NEGATIVE]):
        assert negative in positives and negative != positive
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("hard negatives"))
    assert "of 40 train rows (ranks 1-10 by cosine, margin 0.05, 1 a row at most" in line, line
    assert int(line.split("mined for ")[1].split()[0]) > 0, line

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives as theirs

    rows = datasets.Dataset.from_dict({"anchor": data.train["text"], "positive": data.train["text_pair"]})
    expected = theirs(
        rows,
        SentenceTransformer(str(bundled_model_dir()), device="cpu"),
        range_min=1,
        range_max=10,
        relative_margin=0.05,
        num_negatives=1,
        sampling_strategy="top",
        verbose=False,
    )
    by_row = {(a, p): n for a, p, n in zip(expected["anchor"], expected["positive"], expected["negative"])}
    ours = {(a, p): n for a, p, n in zip(mined.train["text"], mined.train["text_pair"], mined.train[NEGATIVE])}
    assert by_row and all(ours[key] == negative for key, negative in by_row.items())


FAQ = [
    {"anchor": f"question {q} about {topic}", "positive": f"the answer about {topic}"}
    for topic in ("billing", "shipping", "returns", "accounts", "privacy")
    for q in range(8)
]


def test_a_row_the_miner_found_none_for_never_gets_its_own_anchors_positive():
    """FAQ data, 5 answers x 8 questions: with the default range (from the 10th), no row has a candidate, and the
    fallback drew a row's own answer for 6 of 40 rows. It draws another answer; 16 identical rows, where no text
    can be a negative, are refused saying why."""
    from byoc.training.data import DataError

    args = parse_hyperparameters({"mine_hard_negatives": "true", "max_length": "64"})
    for seed in range(2):
        mined = mine_hard_negatives(rows_data(FAQ), str(bundled_model_dir()), dataclasses.replace(args, seed=seed))
        pairs = list(zip(mined.train["text_pair"], mined.train[NEGATIVE]))
        assert all(negative != positive for positive, negative in pairs), pairs
    same = [{"anchor": "where is my parcel", "positive": "it ships in two days"}] * 16
    with pytest.raises(DataError, match="no text can be its negative"):
        mine_hard_negatives(rows_data(same), str(bundled_model_dir()), args)


def test_without_the_setting_the_data_are_as_given():
    data = rows_data(ROWS[:4])
    assert mine_hard_negatives(data, "unused", parse_hyperparameters({})) is data


@pytest.mark.parametrize(
    "change,words",
    [
        ({"label_names": ["score"]}, "an embedding model's scored pairs"),
        ({"task": tasks.SINGLE_LABEL, "label_names": ["a", "b"]}, "the data of a single-label classifier"),
    ],
)
def test_data_that_are_no_anchor_positive_rows_are_refused_naming_them(change, words):
    data = dataclasses.replace(rows_data(ROWS[:4]), **change)
    with pytest.raises(HyperparameterError, match=words):
        mine_hard_negatives(data, "unused", parse_hyperparameters({"mine_hard_negatives": "true"}))


def test_the_range_must_hold_a_text():
    with pytest.raises(HyperparameterError, match="negatives_range_max"):
        parse_hyperparameters({"mine_hard_negatives": "true", "negatives_range_min": "10", "negatives_range_max": "10"})
    parse_hyperparameters({"negatives_range_min": "10", "negatives_range_max": "10"})  # unused: no matter


@pytest.mark.integration
def test_a_job_mines_then_trains_on_the_mined_triplets(job, tiny_model_dir, caplog):
    job.hyperparameters(
        {
            "max_steps": "4",
            "per_device_train_batch_size": "8",
            "mine_hard_negatives": "true",
            "negatives_range_min": "2",
        }
    )
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("hard negatives: mined for") and "of 32 train rows" in m for m in messages)
    assert job.metrics["task"] == tasks.EMBEDDING


def test_a_rerankers_rows_beside_scored_train_pairs_become_pairs_too():
    """Scored train pairs stay as they are; eval rows beside them still become labelled pairs (they were left
    as rows without labels, which a reranker's evaluation cannot score)."""
    from byoc.training.negatives import as_pairs

    train = datasets.Dataset.from_dict({"text": ["a", "b"], "text_pair": ["c", "d"], "label": [0.0, 1.0]})
    rows = {"text": ["q"], "text_pair": ["p"], "text_negative": ["n"], "label": [float("nan")]}
    data = TaskData(train, datasets.Dataset.from_dict(rows), None, ["score"], False, tasks.RERANKER)
    paired = as_pairs(data)
    assert paired.train is train and paired.label_names == ["score"]
    assert list(zip(paired.eval["text_pair"], paired.eval["label"])) == [("p", 1.0), ("n", 0.0)]


def test_a_rerankers_rows_get_several_negatives_each_the_hardest_first_and_each_its_own_pair(caplog):
    """num_negatives=3: util.mine_hard_negatives' three top ones a row (fewer where fewer are in range), in
    text_negative, text_negative_2, text_negative_3; the reranker makes each an irrelevant pair."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives as theirs

    hyperparameters = {"mine_hard_negatives": "true", "negatives_range_min": "1", "negatives_range_max": "10"}
    args = parse_hyperparameters({**hyperparameters, "num_negatives": "3", "max_length": "64"})
    data = dataclasses.replace(rows_data(ROWS), task=tasks.RERANKER)
    mined = mine_hard_negatives(data, str(bundled_model_dir()), args)
    columns = [NEGATIVE, NEGATIVE + "_2", NEGATIVE + "_3"]
    assert all(column in mined.train.column_names for column in columns)
    rows = datasets.Dataset.from_dict({"anchor": data.train["text"], "positive": data.train["text_pair"]})
    expected = theirs(
        rows,
        SentenceTransformer(str(bundled_model_dir()), device="cpu"),
        range_min=1,
        range_max=10,
        relative_margin=0.05,
        num_negatives=3,
        sampling_strategy="top",
        output_format="triplet",
        verbose=False,
    )
    by_row: dict = {}
    for a, p, n in zip(expected["anchor"], expected["positive"], expected["negative"]):
        by_row.setdefault((a, p), []).append(n)
    for row in mined.train:
        own = [row[column] for column in columns if row[column] is not None]
        if (row["text"], row["text_pair"]) in by_row:
            assert own == by_row[(row["text"], row["text_pair"])][:3]
    pairs = tasks.get(tasks.RERANKER).rows.pairs_of_rows(mined.train, "train")
    negatives = sum(row[column] is not None for row in mined.train for column in columns)
    assert len(pairs) == len(ROWS) + negatives > 2 * len(ROWS)
    assert sum(label == 0.0 for label in pairs["label"]) == negatives


@pytest.mark.parametrize(
    "hyperparameters, task, words",
    [
        ({"num_negatives": "2"}, tasks.RERANKER, "set mine_hard_negatives=true too"),
        ({"num_negatives": "2", "mine_hard_negatives": "true"}, tasks.EMBEDDING, "trains on one negative a row"),
    ],
)
def test_several_negatives_are_refused_where_nothing_would_mine_or_use_them(hyperparameters, task, words):
    data = dataclasses.replace(rows_data(ROWS), task=task)
    with pytest.raises(HyperparameterError, match=words):
        mine_hard_negatives(data, str(bundled_model_dir()), parse_hyperparameters(hyperparameters))


@pytest.mark.parametrize("task", ["sparse_embedding", "single_label_classification"])
def test_a_task_whose_negatives_nothing_mines_is_refused_before_any_data_is_read(job, task):
    """task=sparse_embedding with mine_hard_negatives=true failed after 31.5 s (the data read, the model loaded),
    though the two settings alone decide it. The train channel here holds no data at all: the refusal comes first."""
    job.hyperparameters({"task": task, "mine_hard_negatives": "true"})
    (job.channel("train") / "empty.csv").write_text("")
    assert entry.train() != 0
    assert f"hyperparameters task={task} and mine_hard_negatives=true" in job.failure, job.failure
