"""bench-tasks' WikiGold splits (benchmarks/bench_tasks.py): every article in one split, whole, with
its IO tags turned to IOB2, and read back by byoc's own CoNLL reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench_tasks():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_tasks

        yield bench_tasks
    finally:
        sys.path.remove(str(BENCHMARKS))


def article(index: int) -> str:
    """An article whose words name its index: two sentences, a two-word person and two places side by side."""
    return (
        f"Article I-MISC\n{index} I-MISC\nby O\nAnn I-PER\nLee I-PER\n. O\n\n"
        f"From O\nParis I-LOC\nTexas I-LOC\nto O\nRome I-LOC\n. O\n\n"
    )


def test_wikigold_splits_take_whole_articles_seventy_ten_twenty_in_iob2(bench_tasks, tmp_path):
    from byoc.training.data.conll import read_conll

    source = tmp_path / "wikigold.conll.txt"
    # as WikiGold's file: no marker before the first article, one after the last
    source.write_text("-DOCSTART- O\n\n".join(article(i) for i in range(20)) + "-DOCSTART- O\n\n", encoding="utf-8")
    seen = {}
    for channel in ("train", "validation", "test"):
        target = tmp_path / f"{channel}.conll"
        bench_tasks.wikigold_split(source, target, channel)
        rows = read_conll(target.read_text(encoding="utf-8"), target.name)
        seen[channel] = sorted(int(tokens[1]) for tokens in rows["tokens"] if tokens[0] == "Article")
        assert len(rows) == 2 * len(seen[channel])  # both sentences of each article, no -DOCSTART- row
        first, second = rows["tags"].iloc[0], rows["tags"].iloc[1]
        assert list(first) == ["B-MISC", "I-MISC", "O", "B-PER", "I-PER", "O"]
        # IO tags cannot tell two neighbouring places apart: one entity, as the IO file means
        assert list(second) == ["O", "B-LOC", "I-LOC", "O", "B-LOC", "O"]
    assert seen == {
        "train": [1, 2, 4, 6, 7, 8, 9, 11, 12, 14, 16, 17, 18, 19],
        "validation": [3, 13],
        "test": [0, 5, 10, 15],
    }
