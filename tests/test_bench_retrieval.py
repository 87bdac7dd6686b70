"""bench-retrieval's BEIR set built from SICK (benchmarks/bench_retrieval.py): read back by byoc's own reader,
no query able to find its own text, each query's relevant documents its ENTAILMENT pairs' second sentences."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from byoc.training.data.beir import read_set

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench_retrieval():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_retrieval

        yield bench_retrieval
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_sick_set_is_a_beir_set_whose_queries_cannot_find_themselves(bench_retrieval, tmp_path):
    found = read_set(bench_retrieval.write_set(tmp_path / "sick"), "test", "test")
    assert len(found.queries) > 1000 and len(found.corpus) > 2000
    assert not set(found.queries.values()) & set(found.corpus.values())
    pairs = [r for r in bench_retrieval.sick("SICK_test_annotated.txt") if r["entailment_judgment"] == "ENTAILMENT"]
    by_text = {text: key for key, text in found.corpus.items()}
    query = next(key for key, text in found.queries.items() if text == pairs[0]["sentence_A"])
    expected = {
        by_text[r["sentence_B"]]
        for r in pairs
        if r["sentence_A"] == pairs[0]["sentence_A"] and r["sentence_B"] in by_text
    }
    assert found.relevant[query] == expected
